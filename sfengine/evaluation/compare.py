"""Two evaluations of the same (task, init state) pairs, side by side: is the second policy better than the first?

    python -m sfengine.evaluate --experiment=clone_rl --compare_to=clone     # clone's latest evaluation, same mode
    python -m sfengine.evaluate --experiment=clone_rl --compare_to=train_dir/clone/eval/<checkpoint>/results.json

Success rates of two policies on the same pairs are paired data: where both succeed or both fail the pair says
nothing about which is better, so the test is McNemar's, exact (two-sided binomial) on the pairs where exactly
one succeeded. With several episodes a pair, the k-th episode of a pair is matched with the other evaluation's
(k mod n)-th of its n. Only the pairs both evaluated count. ``benchmarks.libero_finetune`` tests each fine-tuned
policy against its clone with the same function.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sfengine.config import ConfigError

SAMPLED_SUFFIX = "_sampled"  # the results folder of an evaluation with --eval_deterministic=false


def find_results(spec: str, train_dir: str | Path, deterministic: bool, env: str) -> tuple[Path, dict]:
    """The evaluation ``--compare_to`` names: a results.json, its folder, or an experiment of ``train_dir`` (its
    latest checkpoint's complete evaluation with the same kind of actions). Raises ConfigError, naming the fix."""
    where, train_dir = f"--compare_to={spec}", Path(train_dir)
    path = Path(spec)
    if path.is_dir() and (path / "results.json").is_file():
        path = path / "results.json"
    elif not path.is_file():
        evaluations = train_dir / spec / "eval"
        if not evaluations.is_dir():
            raise ConfigError(
                f"{where}: no such results.json, and no evaluation of an experiment '{spec}' in {train_dir}; "
                f"evaluate it first (python -m sfengine.evaluate --experiment={spec}) or give a results.json"
            )
        same = [d for d in evaluations.iterdir() if (d / "results.json").is_file()]
        same = sorted(d for d in same if d.name.endswith(SAMPLED_SUFFIX) != deterministic)
        if not same:
            actions = "the mode" if deterministic else "sampled actions"
            raise ConfigError(
                f"{where}: {evaluations} holds no evaluation with {actions}; evaluate it so (--eval_deterministic="
                f"{deterministic}), or give the results.json of another to compare across the two"
            )
        complete = [d for d in same if _complete(d / "results.json")]
        if not complete:
            raise ConfigError(
                f"{where}: the evaluation in {same[-1]} did not complete; finish it (the command that made it, with "
                "--resume) or give its results.json to compare on the pairs it played"
            )
        path = complete[-1] / "results.json"
    try:
        results = json.loads(path.read_text())
        outcomes = [episode["success"] for episode in results["episodes"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: {path} is not an evaluation's results.json ({exc})") from None
    if results.get("env") != env:
        raise ConfigError(f"{where}: {path} evaluated env '{results.get('env')}', not '{env}'; compare on one env")
    if not outcomes or None in outcomes:
        raise ConfigError(f"{where}: {path} has no success for every episode (env '{env}' reports none), so no test")
    return path, results


def _complete(path: Path) -> bool:
    """Whether the evaluation in ``path`` played every episode it set out to (results.json of an evaluation cut
    short says ``"complete": false``; one that cannot be read is left to the caller's check)."""
    try:
        return json.loads(path.read_text()).get("complete", True) is not False
    except (OSError, ValueError, AttributeError):
        return True


def paired_test(before: dict, after: dict) -> dict:
    """McNemar's exact test of ``after`` against ``before`` (results.json contents) on the pairs both evaluated:
    ``pairs`` (episodes of ``after`` that have a counterpart), each side's success over them, ``gained`` (pairs
    only ``after`` succeeded on), ``lost`` and the two-sided ``p_value``."""
    outcomes: dict[tuple[int, int], list[bool]] = {}
    for episode in before["episodes"]:
        outcomes.setdefault((episode["task_index"], episode["init_state"]), []).append(bool(episode["success"]))
    seen: dict[tuple[int, int], int] = {}
    pairs = before_successes = after_successes = gained = lost = 0
    for episode in after["episodes"]:
        key = (episode["task_index"], episode["init_state"])
        if key not in outcomes:
            continue
        k = seen[key] = seen.get(key, -1) + 1
        was, now = outcomes[key][k % len(outcomes[key])], bool(episode["success"])
        pairs += 1
        before_successes += was
        after_successes += now
        gained += now and not was
        lost += was and not now
    n = gained + lost
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n if n else 1.0
    return {
        "pairs": pairs,
        "before": before_successes / pairs if pairs else math.nan,
        "after": after_successes / pairs if pairs else math.nan,
        "gained": gained,
        "lost": lost,
        "p_value": min(1.0, 2 * tail),
    }


def comparison_line(other: Path, test: dict) -> str:
    """``against <path>: success 0.584 -> 0.918 over the same 500 pairs, +33.4 points; McNemar p = 1.3e-35 (186
    gained, 19 lost)``."""
    if not test["pairs"]:
        return f"against {other}: no (task, init state) pair in common; nothing to compare"
    change = 100 * (test["after"] - test["before"])
    return (
        f"against {other}: success {test['before']:.3f} -> {test['after']:.3f} over the same {test['pairs']} pairs, "
        f"{change:+.1f} points; McNemar p = {test['p_value']:.2g} ({test['gained']} gained, {test['lost']} lost)"
    )
