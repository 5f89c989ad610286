"""Time one LIBERO-Spatial env step (sfengine_envs.libero_suite.LiberoSuiteEnv) in state and rgb modes, and split
where the time of a step goes: MuJoCo physics, robosuite's controller and other Python, rendering (mjv_updateScene,
mjr_render, mjr_readPixels), and the adapter's flips/copies.

    python bench_libero_egl.py --sizes 64 128 224 --steps 150 --warmup 20 --out results.json

Each configuration builds a fresh env, resets task 0 / init state 0, warms up, then runs
  A) --steps steps with no instrumentation (the clean ms/step), and
  B) --steps more steps with timers wrapped around the pieces (the split; a little timer overhead included).
For rgb it also times render-only calls (one camera, no stepping) and reads the GL renderer strings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import defaultdict

import numpy as np

T = defaultdict(int)  # name -> ns, inclusive
X = defaultdict(int)  # name -> ns, exclusive (minus the time of timed calls nested in it)
N = defaultdict(int)  # name -> calls
ACTIVE = [False]
STACK = []  # child time of each open timed call


def timed(name, fn):
    def wrapper(*args, **kwargs):
        if not ACTIVE[0]:
            return fn(*args, **kwargs)
        STACK.append(0)
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter_ns() - t0
            child = STACK.pop()
            T[name] += elapsed
            X[name] += elapsed - child
            N[name] += 1
            if STACK:
                STACK[-1] += elapsed

    wrapper.__wrapped__ = fn
    return wrapper


def patch_classes():
    """Wrap module/class level functions once (before any env exists)."""
    import mujoco
    from robosuite.utils import binding_utils as bu

    from sfengine_envs import libero_suite as ls

    bu.MjSim.step = timed("mj_step", bu.MjSim.step)
    bu.MjSim.forward = timed("mj_forward", bu.MjSim.forward)
    bu.MjSim.render = timed("render_total", bu.MjSim.render)
    # binding_utils calls these as mujoco.<name> at call time, so patching the module attribute reaches them.
    for name in ("mj_step1", "mj_step2"):  # sfengine_envs.libero_fast_step calls these as mujoco.<name>
        setattr(mujoco, name, timed(name, getattr(mujoco, name)))
    if hasattr(ls.LiberoSuiteEnv, "_advance"):
        ls.LiberoSuiteEnv._advance = timed("advance", ls.LiberoSuiteEnv._advance)
    mujoco.mjv_updateScene = timed("render.mjv_updateScene", mujoco.mjv_updateScene)
    mujoco.mjr_render = timed("render.mjr_render", mujoco.mjr_render)
    mujoco.mjr_readPixels = timed("render.mjr_readPixels", mujoco.mjr_readPixels)
    ls.LiberoSuiteEnv.step = timed("env_step", ls.LiberoSuiteEnv.step)
    ls.LiberoSuiteEnv._obs = timed("adapter_obs", ls.LiberoSuiteEnv._obs)


def patch_instance(env):
    rs = env.sim.env  # the robosuite (LIBERO problem) env
    env.sim.check_success = timed("check_success", env.sim.check_success)
    rs.step = timed("rs_step", rs.step)
    rs._pre_action = timed("rs_pre_action(controller)", rs._pre_action)
    rs._update_observables = timed("rs_update_observables", rs._update_observables)
    rs._post_action = timed("rs_post_action(reward)", rs._post_action)
    rs._get_observations = timed("rs_get_observations", rs._get_observations)


def gl_strings(env):
    sim = env.sim.env.sim
    ctx = getattr(sim, "_render_context_offscreen", None)
    if ctx is None:
        return {}
    ctx.gl_ctx.make_current()
    from OpenGL import GL

    out = {}
    for key in ("GL_VENDOR", "GL_RENDERER", "GL_VERSION"):
        value = GL.glGetString(getattr(GL, key))
        out[key] = value.decode() if isinstance(value, bytes) else str(value)
    return out


def run_config(obs_mode, size, steps, warmup, render_only_frames, fast_step=None, repeats=3, micro_n=0):
    from sfengine_envs.libero_suite import LiberoSuiteEnv

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    extra = {} if fast_step is None else {"fast_step": fast_step}
    env = LiberoSuiteEnv("libero_spatial", obs_mode=obs_mode, image_size=size, **extra)
    obs, _ = env.reset(options={"task": 0, "init_state": 0})
    build_reset_s = time.perf_counter() - t0
    patch_instance(env)
    actions = rng.uniform(-1.0, 1.0, size=(warmup + (repeats + 1) * steps, 7)).astype(np.float32)
    k = 0
    for _ in range(warmup):
        env.step(actions[k])
        k += 1
    # A: clean timing, `repeats` blocks of `steps` steps; the median block is reported
    clean_blocks = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            env.step(actions[k % len(actions)])
            k += 1
        clean_blocks.append((time.perf_counter_ns() - t0) / 1e6 / steps)
    clean_ms = float(np.median(clean_blocks))
    # B: instrumented
    T.clear()
    X.clear()
    N.clear()
    ACTIVE[0] = True
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        env.step(actions[k % len(actions)])
        k += 1
    instr_ms = (time.perf_counter_ns() - t0) / 1e6 / steps
    ACTIVE[0] = False
    per_step = {name: T[name] / 1e6 / steps for name in T}
    per_step_excl = {name: X[name] / 1e6 / steps for name in X}
    calls = {name: N[name] / steps for name in N}
    result = {
        "obs_mode": obs_mode,
        "fast_step": fast_step,
        "image_size": size if obs_mode == "rgb" else None,
        "steps": steps,
        "build_reset_s": round(build_reset_s, 3),
        "clean_ms_per_step": clean_ms,
        "clean_blocks_ms": clean_blocks,
        "instrumented_ms_per_step": instr_ms,
        "ms_per_step": per_step,
        "ms_per_step_exclusive": per_step_excl,
        "calls_per_step": calls,
        "obs_shapes": {k2: list(v.shape) for k2, v in obs.items()},
    }
    if obs_mode == "rgb":
        result["gl"] = gl_strings(env)
        sim = env.sim.env.sim
        for _ in range(5):
            sim.render(size, size, camera_name="agentview")
        t0 = time.perf_counter_ns()
        for _ in range(render_only_frames):
            sim.render(size, size, camera_name="agentview")
        result["render_only_ms_per_frame"] = (time.perf_counter_ns() - t0) / 1e6 / render_only_frames
        img = np.asarray(sim.render(size, size, camera_name="agentview"))
        result["image_mean"] = float(img.mean())  # a black image would mean rendering failed
    if micro_n:
        result["micro"] = micro(env, obs_mode, size, micro_n)
    env.close()
    return result


def _loop_ms(fn, n):
    fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / 1e6 / n


def micro(env, obs_mode, size, n):
    """Per-call costs timed in tight loops (two clock reads per loop, so no per-call timer overhead): the split
    that does not depend on a cheap clock. The simulator state is restored afterwards."""
    import mujoco

    def raw(f):
        return getattr(f, "__wrapped__", f)

    rs = env.sim.env
    sim = rs.sim
    m, d = sim.model._model, sim.data._data
    saved = sim.get_state().flatten()
    action = np.zeros(7)
    out = {
        "mj_forward": _loop_ms(lambda: raw(mujoco.mj_forward)(m, d), n),
        "mj_step": _loop_ms(lambda: raw(mujoco.mj_step)(m, d), n),
        "mj_step1+mj_step2": _loop_ms(lambda: (raw(mujoco.mj_step1)(m, d), raw(mujoco.mj_step2)(m, d)), n),
        "controller _pre_action (incl. its mj_forward)": _loop_ms(lambda: raw(rs._pre_action)(action, False), n),
        "_update_observables (one substep, no camera due)": _loop_ms(lambda: raw(rs._update_observables)(), n),
        "_get_observations": _loop_ms(lambda: raw(rs._get_observations)(), n),
        "check_success": _loop_ms(lambda: raw(env.sim.check_success)(), n),
    }
    obs_raw = raw(rs._get_observations)()
    out["adapter _obs"] = _loop_ms(lambda: raw(type(env)._obs)(env, obs_raw), n)
    t0 = time.perf_counter_ns()
    for _ in range(10000):
        time.perf_counter_ns()
    out["perf_counter_ns call (us)"] = (time.perf_counter_ns() - t0) / 1e3 / 10000
    if obs_mode == "rgb":
        from OpenGL import GL

        ctx = sim._render_context_offscreen
        ctx.gl_ctx.make_current()
        render_fn = raw(sim.render)
        for cam in ("agentview", "robot0_eye_in_hand"):
            cam_id = sim.model.camera_name2id(cam)
            out[f"{cam}: sim.render (updateScene+render+readPixels)"] = _loop_ms(
                lambda cam=cam: render_fn(sim, size, size, camera_name=cam), n
            )
        cam_id = sim.model.camera_name2id("agentview")
        ctx.cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        ctx.cam.fixedcamid = cam_id
        viewport = mujoco.MjrRect(0, 0, size, size)
        buf = np.empty((size, size, 3), np.uint8)

        def upd():
            return raw(mujoco.mjv_updateScene)(m, d, ctx.vopt, ctx.pert, ctx.cam, mujoco.mjtCatBit.mjCAT_ALL, ctx.scn)

        out["agentview: mjv_updateScene"] = _loop_ms(upd, n)
        upd()

        def draw():
            return raw(mujoco.mjr_render)(viewport, ctx.scn, ctx.con)

        GL.glFinish()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            draw()
        GL.glFinish()
        out["agentview: mjr_render xN then one glFinish (draw throughput)"] = (time.perf_counter_ns() - t0) / 1e6 / n
        draw()
        GL.glFinish()
        out["agentview: mjr_readPixels after glFinish (readback alone)"] = _loop_ms(
            lambda: raw(mujoco.mjr_readPixels)(buf, None, viewport, ctx.con), n
        )
        out["agentview: mjr_render+glFinish (latency of one draw)"] = _loop_ms(lambda: (draw(), GL.glFinish()), n)

        def full():
            return render_fn(sim, size, size, camera_name="agentview")

        flags = ctx.scn.flags
        for flag in ("mjRND_SHADOW", "mjRND_REFLECTION"):
            idx = getattr(mujoco.mjtRndFlag, flag)
            old = flags[idx]
            flags[idx] = 0
            out[f"agentview: sim.render with {flag} off"] = _loop_ms(full, n)
            flags[idx] = old

        # Rendering inside a step follows ~10-20 ms of CPU work with the GPU idle: time one frame after such a gap.
        def after_gap(gap_ms, busy):
            total = 0
            for _ in range(max(n // 4, 5)):
                if busy:
                    end = time.perf_counter_ns() + gap_ms * 1_000_000
                    while time.perf_counter_ns() < end:
                        pass
                else:
                    time.sleep(gap_ms / 1000)
                t0 = time.perf_counter_ns()
                full()
                total += time.perf_counter_ns() - t0
            return total / 1e6 / max(n // 4, 5)

        for gap_ms in (2, 10, 20):
            out[f"agentview: sim.render after {gap_ms} ms CPU busy-wait"] = after_gap(gap_ms, True)
        out["agentview: sim.render after 20 ms sleep"] = after_gap(20, False)
        quality = m.vis.quality
        old_samples = quality.offsamples
        quality.offsamples = 0
        ctx.con.free()
        ctx._set_mujoco_context_and_buffers()
        out["agentview: sim.render with offsamples=0 (no MSAA)"] = _loop_ms(full, n)
        old_shadow = quality.shadowsize
        quality.shadowsize = 1024
        ctx.con.free()
        ctx._set_mujoco_context_and_buffers()
        out["agentview: sim.render with offsamples=0, shadowsize=1024"] = _loop_ms(full, n)
        quality.offsamples, quality.shadowsize = old_samples, old_shadow
        ctx.con.free()
        ctx._set_mujoco_context_and_buffers()
        out["model offsamples, shadowsize"] = [int(old_samples), int(old_shadow)]
    sim.set_state_from_flattened(saved)
    sim.forward()
    return out


def derive(r):
    """Exclusive times: each piece without the timed pieces nested in it, so the rows add up to env.step."""
    x = r["ms_per_step_exclusive"]

    def g(k):
        return x.get(k, 0.0)

    render = r["ms_per_step"].get("render_total", 0.0)
    return {
        "physics (mj_step/mj_forward/mj_step1/mj_step2, all calls)": g("mj_step")
        + g("mj_forward")
        + g("mj_step1")
        + g("mj_step2"),
        "controller (robosuite _pre_action, OSC; minus its mj_forward)": g("rs_pre_action(controller)"),
        "render total (2 cameras)": render,
        "  mjv_updateScene": g("render.mjv_updateScene"),
        "  mjr_render": g("render.mjr_render"),
        "  mjr_readPixels": g("render.mjr_readPixels"),
        "  render python rest (sim.render wrapper)": g("render_total"),
        "other observables (state sensors, minus render)": g("rs_update_observables"),
        "robosuite _post_action (reward)": g("rs_post_action(reward)"),
        "robosuite _get_observations": g("rs_get_observations"),
        "step loop rest (robosuite step or fast_step, python)": g("rs_step") + g("advance"),
        "LIBERO check_success": g("check_success"),
        "adapter _obs (flips, copies, casts)": g("adapter_obs"),
        "adapter step rest": g("env_step"),
        "env.step total (instrumented)": r["ms_per_step"].get("env_step", 0.0),
    }


def machine_info():
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "nproc": os.cpu_count(),
        "MUJOCO_GL": os.environ.get("MUJOCO_GL"),
        "PYOPENGL_PLATFORM": os.environ.get("PYOPENGL_PLATFORM"),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except Exception:
        pass
    import mujoco
    import robosuite

    info.update(mujoco=mujoco.__version__, robosuite=robosuite.__version__, numpy=np.__version__)
    try:
        info["affinity"] = len(os.sched_getaffinity(0))
    except Exception:
        pass
    return info


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 224])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--render_only_frames", type=int, default=100)
    p.add_argument("--no_state", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--micro_n", type=int, default=0, help="tight-loop per-call timings with this many calls")
    p.add_argument("--variants", default="auto", help="auto: stock and fast step where LiberoSuiteEnv has fast_step")
    p.add_argument("--label", default=platform.node())
    p.add_argument("--out", default="")
    args = p.parse_args()
    from sfengine_envs.libero_suite import choose_headless_gl

    choose_headless_gl()  # as the env does for rgb, but before importing robosuite here
    patch_classes()
    results = {"label": args.label, "machine": machine_info(), "configs": []}
    print(json.dumps(results["machine"]), flush=True)
    import inspect

    from sfengine_envs.libero_suite import LiberoSuiteEnv

    has_fast = "fast_step" in inspect.signature(LiberoSuiteEnv.__init__).parameters
    variants = [False, True] if has_fast else [None]
    results["machine"]["sfengine_envs"] = sys.modules["sfengine_envs"].__file__
    configs = [(v, "state", 0) for v in variants if not args.no_state] + [
        (v, "rgb", s) for s in args.sizes for v in variants
    ]
    for fast, mode, size in configs:
        r = run_config(
            mode,
            size,
            args.steps,
            args.warmup,
            args.render_only_frames,
            fast,
            args.repeats,
            args.micro_n if fast in (None, True) else 0,
        )
        r["split"] = derive(r)
        results["configs"].append(r)
        print(
            f"\n== {args.label} {mode} {size or ''} fast_step={fast}: clean {r['clean_ms_per_step']:.2f} ms/step, "
            f"instrumented {r['instrumented_ms_per_step']:.2f} ms/step, build+reset {r['build_reset_s']} s",
            flush=True,
        )
        if "gl" in r:
            print(
                f"   GL: {r['gl']}  render-only {r['render_only_ms_per_frame']:.3f} ms/frame, "
                f"image mean {r['image_mean']:.1f}",
                flush=True,
            )
        for k, v in r["split"].items():
            print(f"   {k:42s} {v:8.3f} ms", flush=True)
        print("   clean blocks:", [round(b, 2) for b in r["clean_blocks_ms"]], flush=True)
        for k, v in r.get("micro", {}).items():
            print(f"   micro {k:62s} {v if isinstance(v, list) else round(v, 4)}", flush=True)
        print("   calls/step:", {k: round(v, 1) for k, v in r["calls_per_step"].items()}, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
