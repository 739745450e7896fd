import sys

import click


@click.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the demo's outputs.")
@click.option("--jobs", type=click.IntRange(min=1),
              help="Steps at once [default: as many as the cores allow]; 1 runs them one after another.")
def demo_command(out: str, jobs: int | None) -> None:
    """Run the demo pipeline on the embedded world and print where its report went."""
    from pipelines.demo import run_demo

    for path in run_demo(out, log=click.echo, jobs=jobs, status_stream=sys.stdout):
        click.echo(f"report: {path.resolve()}")


COMMANDS = [demo_command]
