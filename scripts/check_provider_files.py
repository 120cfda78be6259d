#!/usr/bin/env python3
"""Checks that the providers keep the file layout docs/architecture.md states.

Every provider directory src/providers/<p>/ holds, for each shared concept,
<p>_<concept>.hpp beside <p>_<concept>.cpp, whose header declares the class
<P><Concept> (ShmQp, TcpProgress, ...); every other file carries the <p>_
prefix; a source without a header of its own is one concern of a class's
implementation (<p>_qp_remote.cpp beside <p>_qp.hpp); quoted includes name
core/, rdmakit/ or the provider's own providers/<p>/ headers. The provider's
file table in docs/architecture.md lists exactly the files present.

    scripts/check_provider_files.py   (from anywhere; exit 1 on a finding)
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROVIDERS = ("shm", "tcp", "verbs")
# concept -> class name suffix (None: no class of its own)
CONCEPTS = {
    "context": "Context",
    "qp": "Qp",
    "cq": "Cq",
    "mr": "Mr",
    "srq": "Srq",
    "listener": "Listener",
    "handshake": None,
    "progress": "Progress",
}
DOC = ROOT / "docs" / "architecture.md"


def provider_files(p):
    d = ROOT / "src" / "providers" / p
    return sorted(f.name for f in d.iterdir() if f.is_file() and f.name != "CMakeLists.txt")


def expand(token):
    """`shm_mr.{hpp,cpp}` -> [shm_mr.hpp, shm_mr.cpp]."""
    m = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", token)
    if not m:
        return [token]
    return [m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")]


def documented_files(p, text):
    """File names in the table of the `### <p>` section of the doc."""
    section = re.search(rf"^### {p}\b.*?$(.*?)(?=^##)", text + "\n##", re.M | re.S)
    if not section:
        return None
    names = set()
    for line in section.group(1).splitlines():
        if not line.startswith("|"):
            continue
        first_cell = line.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first_cell):
            names.update(n for n in expand(token) if re.fullmatch(r"[\w.]+\.[ch]pp", n))
    return names


def check(p, doc_text):
    problems = []
    files = provider_files(p)
    present = set(files)
    prefix = p + "_"
    for concept, suffix in CONCEPTS.items():
        for ext in ("hpp", "cpp"):
            name = f"{prefix}{concept}.{ext}"
            if name not in present:
                problems.append(f"{p}: missing {name}")
        header = ROOT / "src" / "providers" / p / f"{prefix}{concept}.hpp"
        if suffix and header.exists():
            cls = p.capitalize() + suffix
            if not re.search(rf"^(class|struct) {cls}\b", header.read_text(), re.M):
                problems.append(f"{p}: {header.name} does not declare class {cls}")
    for name in files:
        if not re.fullmatch(rf"{p}_[a-z0-9_]+\.(hpp|cpp)", name):
            problems.append(f"{p}: {name} is not named {prefix}<what>.hpp/.cpp")
            continue
        if name.endswith(".cpp") and name[:-4] + ".hpp" not in present:
            stem = name[len(prefix):-4]
            owner = next((c for c in CONCEPTS if stem.startswith(c + "_")), None)
            if owner is None or f"{prefix}{owner}.hpp" not in present:
                problems.append(f"{p}: {name} has no header beside it "
                                f"(nor is it {prefix}<concept>_<concern>.cpp)")
        text = (ROOT / "src" / "providers" / p / name).read_text()
        for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
            if not re.match(rf"(core|rdmakit|providers/{p})/", inc):
                problems.append(f'{p}: {name} includes "{inc}" (use core/, rdmakit/ '
                                f"or providers/{p}/ paths from src/)")
    documented = documented_files(p, doc_text)
    if documented is None:
        problems.append(f"{p}: docs/architecture.md has no '### {p}' section")
    else:
        for name in sorted(present - documented):
            problems.append(f"{p}: {name} is not in the file table of docs/architecture.md")
        for name in sorted(documented - present):
            problems.append(f"{p}: docs/architecture.md lists {name}, which does not exist")
    return problems


def main():
    doc_text = DOC.read_text()
    problems = [msg for p in PROVIDERS for msg in check(p, doc_text)]
    for msg in problems:
        print(f"provider files: {msg}", file=sys.stderr)
    if problems:
        print("provider files: see 'Providers' in docs/architecture.md", file=sys.stderr)
        return 1
    print(f"provider files: {', '.join(PROVIDERS)} follow docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
