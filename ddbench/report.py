"""figures/README.md: the index of replayed figures and the paper-vs-replay table, which has a
row for every number in traces/paper/reported.json (replayed or not, with the reason)."""

from __future__ import annotations

from ddbench.core.paper_numbers import Reported


def fmt_value(value: float, unit: str) -> str:
    if unit.startswith("fraction"):
        return f"{100 * value:.1f}%"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ").replace("\t", " ")


def render_index(results, paper: dict[str, Reported], coverage: str | None = None) -> str:
    lines = [
        "# Replayed figures",
        "",
        "Written by `make figures` (`ddbench figures`); do not edit by hand. Each figure is a PNG, a PDF",
        "and a CSV of its data. The paper's numbers come from `traces/paper/reported.json`, each with",
        "the sentence that states it and its status.",
        "",
        "| figure | what | setup |",
        "| --- | --- | --- |",
    ]
    for exp, res in results:
        lines.append(f"| [{exp.id}]({exp.id}.png) ([csv]({exp.id}.csv)) | {exp.title} | {_cell(res.setup)} |")
    lines += ["", "## Paper against replay", ""]
    if coverage:
        lines += [f"**{coverage}.** Every number the paper's text states has a row below: first those a figure",
                  "replays, then the rest with the reason.", ""]
    lines += [
        "| figure | paper's claim | paper | replay | replay / paper | why they differ, or what we computed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    done = set()
    for exp, res in results:
        for c in res.comparisons:
            rep = paper[c.paper_id]
            done.add(rep.id)
            ratio = f"{c.ours / rep.value:.2f}" if rep.value else ("equal" if c.ours == rep.value else "n/a")
            note = c.note
            if rep.derived:
                note = f"(the paper implies {fmt_value(rep.value, rep.unit)}: {rep.derived}) " + note
            if rep.inconsistency:
                note += f". **Inconsistent in the paper:** {rep.inconsistency}"
            lines.append(f"| {rep.figure} | \"{_cell(rep.quote)}\" | {fmt_value(rep.value, rep.unit)} | "
                         f"{fmt_value(c.ours, rep.unit)} | {ratio} | {_cell(note)} |")
    rest = sorted((r for r in paper.values() if r.id not in done), key=lambda r: (r.status, r.figure, r.id))
    if rest:
        lines += ["", "### Not replayed", "",
                  "| figure | id | paper's claim | paper | status | why |", "| --- | --- | --- | --- | --- | --- |"]
        for rep in rest:
            why = rep.reason
            if rep.replayed:
                why = "marked replayed, but no figure of this run compares it" \
                    + (f" ({rep.reason})" if rep.reason else "")
            lines.append(f"| {rep.figure} | `{rep.id}` | \"{_cell(rep.quote)}\" | {fmt_value(rep.value, rep.unit)} | "
                         f"{rep.status} | {_cell(why)} |")
    return "\n".join(lines) + "\n"
