from ddbench.cli import run

run()
