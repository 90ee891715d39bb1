"""Regenerate the report-derived numbers in docs/ from the committed data.

    .venv/bin/python scripts/doc_numbers.py          # rewrite every generated fragment in place
    .venv/bin/python scripts/doc_numbers.py --check  # exit 1 and name the stale fragments

A fragment sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` in a Markdown file; its
text is GENERATORS[NAME](repository root). tests/test_doc_numbers.py runs the check, so a regenerated zoo or
report cannot leave a stale number in the docs.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = re.compile(r"(<!-- generated:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _train_records(root: Path) -> list[dict]:
    out = []
    for p in sorted((root / "checkpoints").glob("*/train.json")):
        t = json.loads(p.read_text(encoding="utf-8"))
        model = (t.get("recipe") or {}).get("model") or {}
        if "arch" in model and "n_layer" in model:
            out.append(
                {
                    "design": model["arch"],
                    "L": int(model["n_layer"]),
                    "seed": t.get("seed", 0),
                    "loss": t.get("final_val_loss"),
                    "params": (t.get("params") or {}).get("total"),
                    "lr": (t.get("recipe") or {}).get("lr"),
                    "minutes": (t.get("wall_time_s") or 0) / 60,
                }
            )
    return out


def zoo_losses(root: Path) -> str:
    """The CPU-zoo table of docs/training.md: final validation loss per design and depth (seed 0; with more
    seeds, their mean and range), achieved params, peak LR and training wall time, from checkpoints/*/train.json."""
    from depthlens.designs import SLUGS

    recs = _train_records(root)
    if not recs:
        return "(no checkpoints/ here)\n"
    depths = sorted({r["L"] for r in recs})
    lines = ["| design | " + " | ".join(f"L={L}" for L in depths) + " |", "|---|" + "---|" * len(depths)]
    for design in [s for s in SLUGS if any(r["design"] == s for r in recs)]:
        cells = []
        for L in depths:
            rs = sorted((r for r in recs if r["design"] == design and r["L"] == L), key=lambda r: r["seed"])
            if not rs:
                cells.append("—")
                continue
            r0 = rs[0]
            loss = f"{r0['loss']:.3f}"
            if len(rs) > 1:
                v = np.array([r["loss"] for r in rs])
                loss = f"{v.mean():.3f} ({len(rs)} seeds {v.min():.3f}–{v.max():.3f})"
            cells.append(f"{loss} ({round(r0['params'] / 1000)}K, LR {r0['lr']:g}, {r0['minutes']:.1f} min)")
        lines.append(f"| {design} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# timings are not generated into the docs: they live in the git-ignored reports/zoo/timings.json (machine facts)
GENERATORS: dict[str, Callable[[Path], str]] = {"zoo-losses": zoo_losses}


def render(text: str, root: Path = ROOT) -> str:
    """`text` with every generated fragment replaced by its generator's output."""

    def sub(m: re.Match) -> str:
        gen = GENERATORS.get(m.group("name"))
        return m.group(0) if gen is None else m.group(1) + gen(root) + m.group(4)

    return FRAGMENT.sub(sub, text)


def stale(root: Path = ROOT) -> list[str]:
    """Files whose generated fragments differ from what the committed data gives."""
    out = []
    for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = p.read_text(encoding="utf-8")
        if FRAGMENT.search(text) and render(text, root) != text:
            out.append(str(p.relative_to(root)))
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for p in bad:
            print(f"{p}: generated numbers are stale; run .venv/bin/python scripts/doc_numbers.py", file=sys.stderr)
        return 1 if bad else 0
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = p.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            p.write_text(new, encoding="utf-8")
            print(f"rewrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
