#!/usr/bin/env python3
"""rdmakit-preload(7) from docs/preload.md: the environment variables are the
rows of the table under "## `rdmakit-run [options] CMD [ARGS...]`", the one
source of both (a variable added to the doc is in the man page).
  preload-man.py docs/preload.md VERSION OUT"""
import re
import sys


def roff(text):
    """Markdown cell text to roff: links to their text, code to bold."""
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return text


def table_rows(markdown):
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## `rdmakit-run"))
    rows, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("| option | variable"):
            in_table = True
            continue
        if in_table and line.startswith("|---"):
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append(cells + [""] * (4 - len(cells)))
    if not rows:
        sys.exit("preload-man.py: no variable table in the rdmakit-run section")
    return rows


def main():
    source, version, out = sys.argv[1:4]
    rows = table_rows(open(source, encoding="utf-8").read())
    page = [
        f'.TH RDMAKIT-PRELOAD 7 "" "rdmakit {version}" "rdmakit manual"',
        ".SH NAME",
        "rdmakit-preload \\- unmodified socket programs over rdmakit streams (LD_PRELOAD)",
        ".SH SYNOPSIS",
        ".B rdmakit-run",
        "[\\fIoptions\\fR] \\fICMD\\fR [\\fIARGS\\fR...]",
        ".br",
        ".B LD_PRELOAD=librdmakit-preload.so",
        "\\fICMD\\fR [\\fIARGS\\fR...]",
        ".SH DESCRIPTION",
        "librdmakit\\-preload.so carries a TCP connection between two preloaded",
        "processes on one host over an rdmakit stream on the shm provider, between",
        "two hosts with a usable RDMA device over one on the verbs provider; every",
        "other connection stays on kernel TCP, and the reason is logged. The",
        "variables below are read once per process; rdmakit\\-run(1) sets them from",
        "its options.",
        ".SH ENVIRONMENT",
    ]
    for option, variable, default, text in rows:
        names = variable.replace("`..._", "`RDMAKIT_PRELOAD_") if variable else option
        page += [".TP", roff(names)]
        body = []
        if text:
            body.append(roff(text).rstrip(".") + ".")
        if default:
            body.append("Default: " + roff(default) + ".")
        if option:
            body.append("rdmakit\\-run option: " + roff(option) + ".")
        page.append(" ".join(body))
    page += [".SH SEE ALSO", "rdmakit\\-run(1), docs/preload.md in the rdmakit sources"]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(page) + "\n")


main()
