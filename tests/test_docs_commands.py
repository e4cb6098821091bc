"""Every `planner ...` command shown in README.md and docs/*.md runs as shown.

The commands are read from the fenced code blocks: every line of a block that starts with
`planner ` (or `$ planner `), and in ```bash / ```sh blocks also `eval "$(planner ...)"`,
`x=$(planner ...)` and `... && planner ...`; a trailing `\\` joins the next line. Each page's
commands run in order, in one temporary folder, through the real entry point
(`planner.cli.main`, in this process): `> FILE` writes the command's stdout to FILE there (a
later command of the page may read it), and a ```yaml block whose first line is `# NAME.yaml`
is written there as NAME.yaml first (the scenarios of `planner batch`). A command passes with
exit code 0, or with the code in EXPECTED_EXIT where the page shows an error on purpose;
SKIPPED lists, with the reason, the commands that cannot run here. Both tables must match a
command the docs show, so neither goes stale.

`python tests/test_docs_commands.py hardware` prints the catalog tables of docs/hardware.md
from the built-in specs (paste them over the page's tables when a spec changes).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# a substring of the command (after `\` joins) -> why it is not run
SKIPPED = {
    "--scheduler tcp://10.0.0.5:8786": "needs a running Dask scheduler at that address",
    "-H specs/my-system.yaml": "stands for the reader's own spec files (specs/my-gpu.yaml)",
}

# a substring of the command -> the exit code its page shows on purpose
EXPECTED_EXIT = {
    "-m vgg16 -H k80-fdr --global-batch 4096 --nodes-max 2": 1,  # infeasible, JSON error document
    "-m alexnet -H h100-sxm5-80gb --global-batch 256": 2,  # a device given as --hardware
    "--devices 24 --tp 8 --pp 3 --global-batch 48 --format megatron": 1,  # does not fit: no launcher
}

FENCE = re.compile(r"^\s*```\s*([\w-]*)\s*$")
SHELL = ("bash", "sh", "shell", "console")


@dataclass(frozen=True)
class DocCommand:
    page: str
    line: int
    text: str  # as shown, continuation lines joined

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _planner_part(text: str, lang: str) -> str | None:
    """The `planner ...` command in a shown line, or None when the line runs none."""
    if text.startswith("$ "):
        text = text[2:]
    if text.startswith("planner "):
        return text
    if lang not in SHELL:
        return None
    if (m := re.search(r"\$\((planner .*)\)", text)) is not None:  # eval "$(...)", x=$(...)
        return m.group(1)
    if (m := re.search(r"&&\s*(planner .*)$", text)) is not None:  # pip install . && planner
        return m.group(1)
    return None


def doc_commands(path: Path) -> list[DocCommand]:
    lines = path.read_text().splitlines()
    found, lang, i = [], None, 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is not None:
            lang = None if lang is not None else fence.group(1).lower()
            i += 1
            continue
        if lang is not None:
            start, text = i + 1, lines[i].strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            command = _planner_part(text, lang)
            if command is not None:
                found.append(DocCommand(path.relative_to(ROOT).as_posix(), start, command))
        i += 1
    return found


def shown_outputs(path: Path) -> dict[int, list[str]]:
    """The output a page shows for a command: a fenced block with no language (or `text`)
    right after a block holding exactly one `planner` command, only blank lines between.
    The command's line -> the block's lines that are output (not `#` comments, not `...`
    elisions); `test_every_doc_command_runs` finds each in what the command prints."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and FENCE.match(lines[j]) is None:
            j += 1
        blocks.append((i, j, fence.group(1).lower()))
        i = j + 1
    shown = {}
    for (a0, a1, lang), (b0, b1, out_lang) in zip(blocks, blocks[1:], strict=False):
        starts = [k + 1 for k in range(a0 + 1, a1)
                  if _planner_part(lines[k].strip(), lang) is not None]
        between = lines[a1 + 1:b0]
        if (len(starts) == 1 and out_lang in ("", "text")
                and all(not x.strip() for x in between)):
            shown[starts[0]] = [x for x in lines[b0 + 1:b1] if x.strip()
                                and not x.lstrip().startswith("#") and "..." not in x]
    return shown


def _flat(text: str) -> str:
    return " ".join(text.split())


def yaml_files(path: Path) -> dict[str, str]:
    """```yaml blocks whose first line is `# NAME.yaml`: NAME.yaml -> the block."""
    blocks = re.findall(r"^```ya?ml\n# ([\w.-]+\.ya?ml)\n(.*?)^```", path.read_text(), re.M | re.S)
    return {name: body for name, body in blocks}


def argv_of(command: str) -> tuple[list[str], str | None]:
    """The arguments after `planner`, and the file `> FILE` sends stdout to (or None)."""
    tokens = shlex.split(command, comments=True)
    assert tokens[0] == "planner", command
    args, out = [], None
    for k, token in enumerate(tokens[1:], 1):
        if token in ("|", "&&", ";", "||"):
            break
        if token == ">":
            out = tokens[k + 1]
            break
        args.append(token)
    return args, out


def _match(table: dict, command: DocCommand):
    return next((v for k, v in table.items() if k in command.text), None)


ALL = [c for page in PAGES for c in doc_commands(page)]
BY_PAGE = {page.relative_to(ROOT).as_posix(): doc_commands(page) for page in PAGES}


def _run(capsys, args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_the_docs_show_commands_and_the_tables_are_current():
    assert len(ALL) >= 60, [c.where for c in ALL]
    for table in (SKIPPED, EXPECTED_EXIT):
        for key in table:
            assert any(key in c.text for c in ALL), f"no doc command contains {key!r} any more"
    for c in ALL:
        argv_of(c.text)  # every shown command parses as a shell line


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p, cs in BY_PAGE.items() if cs])
def test_every_doc_command_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, body in yaml_files(ROOT / page).items():
        (tmp_path / name).write_text(body)
    failures = []
    shown = shown_outputs(ROOT / page)
    for c in BY_PAGE[page]:
        if _match(SKIPPED, c) is not None:
            continue
        args, out_file = argv_of(c.text)
        code, out, err = _run(capsys, args)
        if out_file is not None:
            (tmp_path / out_file).write_text(out)
        printed = _flat(out + err)
        failures += [f"{c.where}: the page shows a line it does not print: {line.strip()!r}"
                     for line in shown.get(c.line, []) if _flat(line) not in printed]
        want = _match(EXPECTED_EXIT, c) or 0
        if code != want:
            failures.append(f"{c.where}: exit {code} (want {want}): {c.text}\n    {err.strip()[:400]}")
        elif want and ("Traceback" in err or not err.startswith("planner: ")):
            failures.append(f"{c.where}: exit {code} without its one-line message: {err[:400]}")
    assert not failures, "\n".join(failures)


def test_readme_is_short_and_links_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    assert 'pip install ".[test]" && ruff check . && python -m pytest -q' in readme
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which is missing"


def test_the_hardware_page_names_every_builtin():
    from planner.catalog import list_hardware

    page = (ROOT / "docs" / "hardware.md").read_text()
    names = [n for kind in ("systems", "devices", "links") for n in list_hardware()[kind]]
    missing = [n for n in names if f"`{n}`" not in page]
    assert not missing, f"docs/hardware.md does not list {missing} (python {__file__} hardware)"


def hardware_tables() -> str:
    """The catalog tables of docs/hardware.md, from the built-in specs."""
    import json
    from contextlib import redirect_stdout
    from io import StringIO

    from planner.catalog import list_hardware

    def show(name):
        buf = StringIO()
        with redirect_stdout(buf):
            main(["show", "hardware", name, "--format", "json"])
        return json.loads(buf.getvalue())

    def num(x):
        return "-" if x is None else f"{x:,.0f}" if x >= 1000 else f"{x:g}"

    def row(*cells):
        return "| " + " | ".join(str(c) for c in cells) + " |"

    names = list_hardware()
    rows = ["### Systems", "",
            row("system", "devices / node", "scale-up domain", "device", "scale-up link",
                "NICs per node", "host offload"),
            "|---|---:|---:|---|---|---|---|"]
    for n in names["systems"]:
        s = show(n)
        up = (s.get("scale_up") or s["intra_node"] or {}).get("name", "-")
        nic, host = s.get("inter_node") or {}, s.get("host_offload")
        rows.append(row(f"`{n}`", s["devices_per_node"], s["devices_per_scale_up_domain"],
                        f"`{s['device']['name']}`", f"`{up}`",
                        f"{s.get('nics_per_node', 0)} x `{nic.get('name', '-')}`",
                        f"`{host['link']['name']}` / {host['devices_per_link']} GPUs" if host else "-"))
    rows += ["", "### Devices", "",
             row("device", "memory (GiB)", "HBM (GB/s)", "TFLOP/s fp32", "bf16 / fp16", "fp8", "fp4",
                 "default precision", "USD / device-hour"),
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for n in names["devices"]:
        d = show(n)
        p = d["peak_tflops"]
        rows.append(row(f"`{n}`", num(d["memory_GiB"]), num(d["memory_bandwidth_GBps"]),
                        num(p.get("fp32")), num(p.get("bf16") or p.get("fp16")), num(p.get("fp8")),
                        num(p.get("nvfp4") or p.get("fp4")),
                        d.get("default_precision") or "fp32 (assumed)",
                        num(d.get("price_per_hour_usd"))))
    rows += ["", "### Links", "",
             row("link", "GB/s per direction", "latency (us)", "efficiency"), "|---|---:|---:|---:|"]
    for n in names["links"]:
        li = show(n)
        rows.append(row(f"`{n}`", num(li["bandwidth_GBps"]), num(li["latency_us"]),
                        num(li["efficiency"])))
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["hardware"]:
        print(hardware_tables())
    else:
        for c in ALL:
            print(c.where, c.text, sep="\t")
