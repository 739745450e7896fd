"""Option types that several commands share (not a command: MODULES names none here)."""

import math

import click


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan, which passes every bound (each comparison with it is
    false), and inf where a bound is left open."""

    name = "float range"  # as click names FloatRange in --help

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number
