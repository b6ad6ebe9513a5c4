"""figures/README.md: the index of replayed figures and the paper-vs-replay table."""

from __future__ import annotations

from ddbench.core.paper import Reported


def fmt_value(value: float, unit: str) -> str:
    if unit.startswith("fraction"):
        return f"{100 * value:.1f}%"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def render_index(results, paper: dict[str, Reported]) -> str:
    lines = [
        "# Replayed figures",
        "",
        "Written by `make figures` (`ddbench figures`); do not edit by hand. Each figure is a PNG, a PDF",
        "and a CSV of its data. The paper's numbers come from `traces/paper/reported.json`, each with",
        "the sentence that states it.",
        "",
        "| figure | what | setup |",
        "| --- | --- | --- |",
    ]
    for exp, res in results:
        lines.append(f"| [{exp.id}]({exp.id}.png) ([csv]({exp.id}.csv)) | {exp.title} | {res.setup} |")
    lines += [
        "",
        "## Paper against replay",
        "",
        "| figure | paper's claim | paper | replay | replay / paper | why they differ, or what we computed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for exp, res in results:
        for c in res.comparisons:
            rep = paper[c.paper_id]
            ratio = f"{c.ours / rep.value:.2f}" if rep.value else "n/a"
            quote = rep.quote.replace("|", "/")
            lines.append(f"| {rep.figure} | \"{quote}\" | {fmt_value(rep.value, rep.unit)} | "
                         f"{fmt_value(c.ours, rep.unit)} | {ratio} | {c.note} |")
    return "\n".join(lines) + "\n"
