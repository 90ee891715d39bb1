"""The number ledger of README.md and docs/*.md: what counts as a number in the prose, and the check that every one
is accounted for by an entry of tests/doc_numbers_ledger.toml (tests/test_doc_number_ledger.py runs it).

What is prose. A page's text with these parts removed first:
- fenced code blocks (```...```, also indented inside a list) and indented code blocks (4 spaces, after a blank
  line), whose commands are run by tests/test_docs.py and tests/test_readme.py;
- generated fragments (`<!-- generated:NAME -->` ... `<!-- /generated:NAME -->`), written by scripts/doc_numbers.py
  and checked by tests/test_doc_numbers.py;
- HTML comments (`<!-- ... -->`);
- link and image targets: the `(...)` of `[text](target)`, reference definitions `[x]: target`, and bare URLs.
Then every run of whitespace becomes one space (so a sentence broken over lines reads as one line). Inline code
(`...`) stays in the text, so that a context snippet may quote it, but no number is taken from inside it: a span in
backticks is a command, an option, a file name or an identifier, not a quoted quantity.

What is a number. A match of NUMBER (below) in the prose outside inline code, that is not part of a word: not
preceded by a letter (any script: `τ+1`), digit, `_`, `/`, `.`, `#`, `@`, `=`, `^` (`2^18`), `-` glued to a word (`SmolLM2-135M`, `seeds 1-2`), nor
followed by a letter, digit or `_` (other than its own K/M/B/G suffix), so that identifiers (`hc_l32`, `Qwen2.5`,
`GPT-2`, `L4`), file names (`zoo_cpu_lr400.json`), anchors, issue numbers (`#32`, `issue 10`), and version strings
(`==2.13.0`, `v3`, anything of the form d.d.d) are not numbers. Among the matches, these count:
- a decimal (`0.45`, `2.450`), a number in scientific notation (`4.6e5`, `1e-3`);
- a number with a magnitude suffix (`230K`, `407M`, `0.5B`, `5k`) or a unit or ratio after it (`97 %`, `−1.9 pp`, `4.3×`,
  `5x`, `20 s`, `1.9 GB`, `0.15 nats`, see UNITS);
- an integer of two or more digits (`16`, `276`, `1608`), including each end of a range (`827–886`);
- a signed number (`−0.7`, `+83.5`).
A plain one-digit integer with none of the above (`L = 4`, `seed 2`, `k ≤ 7`, `two`) does not count: such integers
are layer indices, seed numbers and small counts, structural rather than measured, and a ledger of every one would
drown the measured numbers it exists for. Years (four digits 1900-2099 right after a name or in parentheses) count;
they are cited as `literature`.

What accounts for a number. A ledger entry names a file and a `context`: a short snippet of that file's prose
(whitespace-normalised as above) that contains the number. The entry covers every number lying inside any occurrence
of its context in that file; `value` lists the numbers of the context as written, in order (checked, so a ledger
entry says in plain text which numbers it vouches for). Its `kind` says why the numbers are right:
- `data`: `source` is a committed file (JSON, or any other file as text; a glob gives a dict path -> data) and `expr` a Python expression over
  it (`d`) that must evaluate to `value` (a string or a list of strings), i.e. the number as the doc writes it,
  computed from the data with the doc's rounding;
- `code`: `expr` evaluates to `value`, reading depthlens through `mod("depthlens.x.y")` (importlib.import_module): a
  definitional constant (a threshold, a default);
- `test`: `test` names an existing test (`tests/FILE.py::NAME`) that checks the number against data; this check
  asserts the test exists and its source names the doc file (it does not run it);
- `literature`: a number quoted from a paper, a spec or an outside source; `cite` says where from (and `expr`, when
  given, is checked as for `code`: the constant depthlens keeps the quoted value in);
- `illustrative`: a value a sentence uses as an example input, or a target the project sets itself, that no data
  could back (`e.g. --n-seq 32`, "the 10 minutes this project aims for"); `why` says so;
- `unverified`: a measurement whose data is not committed; `why` says what it is. Allowed only up to
  MAX_UNVERIFIED entries, each listed in the test's ALLOWED_UNVERIFIED.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "tests" / "doc_numbers_ledger.toml"

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.S | re.M)
INDENTED = re.compile(r"(?<=\n\n)(?:(?: {4}|\t)[^\n]*\n?)+")  # an indented code block after a blank line
GENERATED = re.compile(r"<!-- generated:(?P<name>[a-z0-9-]+) -->.*?<!-- /generated:(?P=name) -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK_TARGET = re.compile(r"\]\([^)\s]*(?:\s+\"[^\"]*\")?\)")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s+\S+.*$", re.M)
URL = re.compile(r"https?://\S+")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")

UNITS = (
    "%",
    "pp",
    "×",
    "x",
    "s",
    "ms",
    "µs",
    "us",
    "min",
    "h",
    "GB",
    "MB",
    "KB",
    "GiB",
    "MiB",
    "KiB",
    "TB",
    "nats",
    "nat",
    "bits",
    "tok/s",
    "it/s",
    "seconds",
    "minutes",
    "hours",
    "CPU-hours",
    "CPU-minutes",
)
_UNIT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
NUMBER = re.compile(
    r"(?P<num>(?P<sign>[−+-])?(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?(?P<exp>e[−+-]?\d+)?(?P<suffix>[KMBGk])?)"
    rf"(?P<unit>\s?(?:{_UNIT})(?![A-Za-z0-9_]))?"
)
YEAR = re.compile(r"(19|20)\d\d")


@dataclass
class Number:
    file: str
    start: int  # offset in the file's prose
    end: int
    text: str  # as written: sign, digits, suffix (not the unit)
    unit: str

    def where(self, prose: str) -> str:
        return prose[max(0, self.start - 60) : self.end + 60]


@dataclass
class Page:
    file: str
    prose: str
    numbers: list[Number] = field(default_factory=list)


def prose_of(markdown: str) -> str:
    """The page's prose: code blocks, generated fragments, comments and link targets removed, whitespace collapsed."""
    text = GENERATED.sub(" ", markdown)
    text = FENCE.sub(" ", text)
    text = INDENTED.sub(" ", text)
    text = COMMENT.sub(" ", text)
    text = REF_DEF.sub(" ", text)
    text = LINK_TARGET.sub("]", text)
    text = URL.sub(" ", text)
    return " ".join(text.split())


def _code_spans(prose: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in INLINE_CODE.finditer(prose)]


def numbers_in(prose: str, file: str = "") -> list[Number]:
    """Every number of `prose` (see the module docstring for the rules)."""
    spans = _code_spans(prose)
    out: list[tuple[Number, bool]] = []
    for m in NUMBER.finditer(prose):
        s = m.start("num")
        if any(a <= s < b for a, b in spans):
            continue
        before = prose[s - 1] if s > 0 else " "
        if m.group("sign") == "-" and s > 0 and re.match(r"[\w)]", before):  # `seeds 1-2`, `a-1`: a hyphen, no sign
            s += 1
            before = "-"
        # part of a word, a path, an identifier, a version, an issue number, an option value
        if re.match(r"[\w/.#@=^\\]", before) or (before == "-" and s > 1 and re.match(r"\w", prose[s - 2])):
            continue
        if re.search(r"\b(issues?|PR|pull request)\s$", prose[max(0, s - 14) : s], re.I):  # `issue 10`: a reference
            continue
        after = prose[m.end("num") : m.end("num") + 1]
        if not m.group("unit") and re.match(r"[A-Za-z0-9_]", after):
            continue
        if after == "." and re.match(r"\.\d", prose[m.end("num") : m.end("num") + 2]):  # d.d.d: a version
            continue
        text = prose[s : m.end("num")]
        unit = (m.group("unit") or "").strip()
        digits = m.group("int").replace(",", "")
        counts = bool(
            m.group("frac") or m.group("exp") or m.group("suffix") or unit or m.group("sign") and s == m.start("num")
        )
        out.append((Number(file, s, m.end("num"), text, unit), counts or len(digits) >= 2))
    # the low end of a range (`0–93 %`) counts when its high end does
    for i, (n, counts) in enumerate(out[:-1]):
        nxt, nxt_counts = out[i + 1]
        if not counts and nxt_counts and re.fullmatch(r"\s?[–-]\s?", prose[n.end : nxt.start]):
            out[i] = (n, True)
    return [n for n, counts in out if counts]


def read_pages(root: Path = ROOT, files: list[str] | None = None) -> dict[str, Page]:
    names = (
        files if files is not None else ["README.md"] + sorted(f"docs/{p.name}" for p in (root / "docs").glob("*.md"))
    )
    pages = {}
    for name in names:
        prose = prose_of((root / name).read_text(encoding="utf-8"))
        pages[name] = Page(name, prose, numbers_in(prose, name))
    return pages


def load_ledger(path: Path = LEDGER) -> list[dict[str, Any]]:
    return list(tomllib.loads(path.read_text(encoding="utf-8")).get("n", []))


def _values(v: Any) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def _occurrences(prose: str, context: str) -> list[int]:
    out, i = [], prose.find(context)
    while i >= 0:
        out.append(i)
        i = prose.find(context, i + 1)
    return out


def _load_source(root: Path, source: str) -> Any:
    if any(c in source for c in "*?["):
        paths = sorted(p for p in root.glob(source) if p.is_file())
        if not paths:
            raise FileNotFoundError(source)
        return {str(p.relative_to(root)): _read(p) for p in paths}
    return _read(root / source)


def _read(path: Path) -> Any:
    """A JSON file's data; any other file's text (a committed page a number is read from)."""
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else text


def _namespace(root: Path) -> dict[str, Any]:
    import math
    import statistics

    def pct(x: float, nd: int = 0) -> str:
        """100·x rounded to nd decimals, as the docs write a share."""
        return f"{100 * x:.{nd}f}"

    def f(x: float, nd: int) -> str:
        return f"{x:.{nd}f}"

    def k(x: float) -> str:
        """A count in thousands, as `230K`."""
        return f"{round(x / 1000)}K"

    def pick(rows: list[dict[str, Any]], key: str, **where: Any) -> Any:
        """rows[i][key] of the one row whose fields equal `where`."""
        (hit,) = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
        return hit[key]

    def zoo_depths() -> list[int]:
        """The depths of the shipped zoo's recipe."""
        runs = _load_source(root, "depthlens/recipes/zoo_cpu.json")["runs"].values()
        return sorted({int(r["model"]["n_layer"]) for r in runs})

    def glob(pattern: str) -> dict[str, Any]:
        return _load_source(root, pattern)

    def load(path: str) -> Any:
        return _load_source(root, path)

    ns = {
        "math": math,
        "statistics": statistics,
        "json": json,
        "pct": pct,
        "f": f,
        "k": k,
        "glob": glob,
        "load": load,
        "pick": pick,
        "zoo_depths": zoo_depths,
    }
    return ns | {"mod": importlib.import_module}


def evaluate(entry: dict[str, Any], root: Path = ROOT) -> list[str]:
    """The values an entry's data or code says the doc should write."""
    ns = _namespace(root)
    if entry["kind"] == "data":
        ns["d"] = _load_source(root, entry["source"])
    got = eval(entry["expr"], ns)  # noqa: S307 - the ledger is committed code, reviewed like a test
    return _values(got) if isinstance(got, (str, list, tuple)) else [str(got)]


def check(root: Path = ROOT, files: list[str] | None = None, ledger: list[dict[str, Any]] | None = None) -> list[str]:
    """Every problem of the ledger against the pages: unledgered numbers, stale entries, wrong values, bad entries."""
    pages = read_pages(root, files)
    entries = load_ledger() if ledger is None else ledger
    problems: list[str] = []
    covered: dict[str, set[int]] = {name: set() for name in pages}
    for i, e in enumerate(entries):
        tag = f"ledger entry {i} ({e.get('file')}: {e.get('context')!r})"
        kind = e.get("kind")
        need = {"data": ("source", "expr"), "code": ("expr",), "test": ("test",), "literature": ("cite",)}
        need |= {"illustrative": ("why",), "unverified": ("why",)}
        if kind not in need:
            problems.append(f"{tag}: unknown kind {kind!r}")
            continue
        missing = [k for k in ("file", "context", "value", *need[kind]) if not e.get(k)]
        if missing:
            problems.append(f"{tag}: missing {', '.join(missing)}")
            continue
        if e["file"] not in pages:
            if files is None or any(fnmatch.fnmatch(e["file"], f) for f in files):
                problems.append(f"{tag}: no such page")
            continue
        page = pages[e["file"]]
        hits = _occurrences(page.prose, e["context"])
        if not hits:
            problems.append(f"{tag}: stale, the context no longer occurs in {e['file']}")
            continue
        want = _values(e["value"])
        for at in hits:
            inside = [n for n in page.numbers if at <= n.start and n.end <= at + len(e["context"])]
            if [n.text for n in inside] != want:
                problems.append(f"{tag}: value {want} but the context holds the numbers {[n.text for n in inside]}")
            covered[e["file"]] |= {n.start for n in inside}
        if kind in ("data", "code") or (kind == "literature" and e.get("expr")):
            try:
                got = evaluate(e, root)
            except Exception as exc:  # noqa: BLE001 - any failure of an entry is a finding
                problems.append(f"{tag}: {kind} expression failed: {type(exc).__name__}: {exc}")
                continue
            if got != want:
                problems.append(f"{tag}: the doc writes {want}, the {kind} gives {got}")
        if kind == "test":
            file, _, name = e["test"].partition("::")
            path = root / file
            src = path.read_text(encoding="utf-8") if path.is_file() else ""
            if not re.search(rf"^\s*def {re.escape(name)}\(", src, re.M):
                problems.append(f"{tag}: no test {e['test']}")
            elif Path(e["file"]).name not in src and e["file"] not in src:
                problems.append(f"{tag}: {file} never names {e['file']}")
    for name, page in pages.items():
        for n in page.numbers:
            if n.start not in covered[name]:
                problems.append(
                    f"{name}: {n.text}{(' ' + n.unit) if n.unit else ''} has no ledger entry: …{n.where(page.prose)}…"
                )
    return problems


def main(argv: list[str]) -> int:
    """`python tests/doc_ledger.py [PAGE ...]`: the problems of those pages (all pages when none), one per line."""
    problems = check(ROOT, argv or None)
    print("\n".join(problems) or "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
