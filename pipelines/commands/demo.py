import click


@click.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the demo's outputs.")
def demo_command(out: str) -> None:
    """Run the demo pipeline on the embedded world and print where its report went."""
    from pipelines.demo import run_demo

    for path in run_demo(out, log=click.echo):
        click.echo(f"report: {path.resolve()}")


COMMANDS = [demo_command]
