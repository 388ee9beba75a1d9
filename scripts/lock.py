"""Resolve a lock file for the machine it targets, without installing or downloading wheels.

    python3 scripts/lock.py check requirements/gpu.lock            # does the lock resolve, closed?
    python3 scripts/lock.py compile requirements/gpu.in -o requirements/gpu.lock

A lock is a pip requirements file of ``name==version`` lines. ``check`` asks pip's resolver to
install every wheel pin of the lock for the target platform (default: manylinux x86_64 up to
glibc 2.35, CPython 3.11) as a dry run with ``--report``: pip reads each wheel's metadata from the
index (PEP 658), so no multi-GB CUDA wheel is fetched. The check fails when the resolver adds a
package the lock does not pin, picks another version, or takes a build with a local label
(``+cpu``) or from a local folder. Pins marked ``# sdist`` have no wheel on the index (DeepSpeed,
ANTLR's runtime for Hydra): they are built from their source archives (a few MB) into pure-Python
wheels first, which the resolution then uses, so their requirements are checked too.

``compile`` resolves the top-level pins of an ``.in`` file the same way and writes the lock.

Only the standard library and pip are needed: it runs before the project's environment exists.
pip runs ``--isolated`` with an explicit ``--index-url`` (``RLMIX_INDEX_URL``, default PyPI): the
user's pip settings, where a local CPU wheel folder may be configured, cannot stand in a CPU torch
for the CUDA build on the index.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import Version

PYPI = "https://pypi.org/simple"
SDIST_MARK = "# sdist"
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s#;]+)")


def read_lock(path: Path) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """({canonical name: (name, version)}, canonical names of the sdist-only pins)."""
    pins, sdists = {}, set()
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            key = canonicalize_name(match[1])
            pins[key] = (match[1], match[2])
            if SDIST_MARK in line:
                sdists.add(key)
    return pins, sdists


def platform_args(glibc: str, python: str) -> list[str]:
    """pip's target-platform flags: every manylinux tag a glibc ``glibc`` x86_64 machine accepts."""
    major, minor = (int(x) for x in glibc.split("."))
    tags = ["linux_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
    tags += [f"manylinux_{major}_{m}_x86_64" for m in range(5, minor + 1)]
    abi = "cp" + python.replace(".", "")
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for tag in tags:
        args += ["--platform", tag]
    return args


def pip(*args: str) -> list[str]:
    """A pip command that sees only ``--index-url`` (and what it is given): ``--isolated`` drops the
    user's and the environment's pip settings, where a local CPU wheel folder may be configured."""
    return [sys.executable, "-m", "pip", *args[:1], "--isolated", "--quiet", "--disable-pip-version-check",
            "--no-input", *args[1:]]


def resolve(requirements: list[str], sdists: list[str], args) -> list[dict]:
    """pip's dry-run resolution for the target platform: the report's ``install`` entries.

    The sdist-only pins are built here into pure-Python wheels that the resolution may use:
    pip takes only wheels when it resolves for another platform.
    """
    with tempfile.TemporaryDirectory(prefix="rlmix_lock_") as tmp:
        req, report, local = Path(tmp, "req.txt"), Path(tmp, "report.json"), Path(tmp, "sdists")
        build_sdists(sdists, args.index_url, local)
        req.write_text("\n".join(requirements + sdists) + "\n")
        cmd = pip("install", "--dry-run", "--ignore-installed", "--index-url", args.index_url, "--find-links",
                  str(local), "--target", str(Path(tmp, "t")), "--report", str(report), "-r", str(req),
                  *platform_args(args.glibc, args.python))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            detail = [ln.strip() for ln in done.stderr.splitlines() if "depends on" in ln or ln.startswith("ERROR")]
            raise SystemExit("lock: pip could not resolve: " + " | ".join(detail or [done.stderr.strip()[-500:]]))
        return json.loads(report.read_text())["install"]


def build_sdists(specs: list[str], index_url: str, into: Path) -> None:
    """Build the sdist-only pins into wheels in ``into``; each must be pure Python (py3-none-any)."""
    if not specs:
        return
    cmd = pip("wheel", "--no-deps", "--index-url", index_url, "-w", str(into), *specs)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"lock: could not build {' '.join(specs)}: {done.stderr.strip()[-500:]}")
    for wheel in into.glob("*.whl"):
        if not wheel.name.endswith("-none-any.whl"):
            raise SystemExit(f"lock: {wheel.name} is not pure Python: it cannot stand in for the target platform")


def check(args) -> int:
    pins, sdist_keys = read_lock(args.lock)
    sdists = [f"{n}=={v}" for key, (n, v) in pins.items() if key in sdist_keys]
    wheels = [f"{n}=={v}" for key, (n, v) in pins.items() if key not in sdist_keys]
    installed = resolve(wheels, sdists, args)
    problems = []
    for item in installed:
        meta, url = item["metadata"], item["download_info"]["url"]
        key, version = canonicalize_name(meta["name"]), meta["version"]
        if key not in pins:
            problems.append(f"{meta['name']}=={version} is needed but not pinned")
        elif Version(version) != Version(pins[key][1]) or Version(version).local:
            problems.append(f"{meta['name']}: lock pins {pins[key][1]}, resolved {version}")
        if url.startswith("file:") and key not in sdist_keys:
            problems.append(f"{meta['name']}: resolved from a local folder ({url}), not from the index")
    for line in problems:
        print(f"{args.lock}: {line}", file=sys.stderr)
    torch = next((i["metadata"]["version"] for i in installed if i["metadata"]["name"] == "torch"), None)
    nvidia = sum(i["metadata"]["name"].startswith("nvidia-") for i in installed)
    verdict = "does NOT resolve" if problems else "resolves"
    print(f"{args.lock}: {verdict} for CPython {args.python} on manylinux x86_64 (glibc <= {args.glibc}): "
          f"{len(installed)} packages ({len(sdists)} built from source archives), torch {torch}, "
          f"{nvidia} nvidia-* packages; no wheel downloaded, only index metadata")
    return 1 if problems else 0


def compile_lock(args) -> int:
    """Write ``args.out`` from the top-level pins in ``args.spec`` (module docstring)."""
    text = args.spec.read_text()
    specs = [(ln.split("#")[0].strip(), SDIST_MARK in ln) for ln in text.splitlines() if ln.split("#")[0].strip()]
    sdists = [spec for spec, is_sdist in specs if is_sdist]
    installed = resolve([spec for spec, is_sdist in specs if not is_sdist], sdists, args)
    sdist_keys = {canonicalize_name(Requirement(spec).name) for spec in sdists}
    lines = []
    for item in installed:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        mark = f"  {SDIST_MARK}: no wheel on the index" if canonicalize_name(name) in sdist_keys else ""
        lines.append(f"{name}=={version}{mark}")
    header = "".join("#" + ln[2:] + "\n" for ln in text.splitlines() if ln.startswith("##"))
    args.out.write_text(header + "\n".join(sorted(lines, key=str.lower)) + "\n")
    print(f"{args.out}: {len(lines)} pins from {args.spec}")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="resolve a lock for its target platform (dry run)")
    c.add_argument("lock", type=Path)
    k = sub.add_parser("compile", help="write a lock from top-level requirements")
    k.add_argument("spec", type=Path)
    k.add_argument("-o", "--out", type=Path, required=True)
    for p in (c, k):
        p.add_argument("--glibc", default="2.35", help="newest glibc of the target machines (manylinux tags)")
        p.add_argument("--python", default="3.11", help="target CPython version")
        p.add_argument("--index-url", default=os.environ.get("RLMIX_INDEX_URL", PYPI))
    args = ap.parse_args()
    path = args.lock if args.command == "check" else args.spec
    if not path.is_file():
        ap.error(f"{path}: no such file")
    raise SystemExit(check(args) if args.command == "check" else compile_lock(args))


if __name__ == "__main__":
    main()
