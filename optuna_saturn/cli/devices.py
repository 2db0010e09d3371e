"""``optuna-saturn devices``: which sweeps on this machine hold which devices (:mod:`optuna_saturn.leases`)."""

from __future__ import annotations

import time

import typer

from optuna_saturn.cli.app import app, examples
from optuna_saturn.leases import LEASES_ENV, current_leases, leases_folder


@app.command(epilog=examples("optuna-saturn devices"))
def devices() -> None:
    """Show the devices that sweeps on this machine hold now, and who runs them.

    A sweep leases its devices while it runs (one lock file per device; the kernel ends a lease with its
    process), so two sweeps on one machine never share a device: the later one waits, and says for whom.
    """
    folder = leases_folder()
    if folder is None:
        typer.echo(f"Device leases are off ({LEASES_ENV}=off): sweeps on this machine do not coordinate.")
        return
    held = current_leases(folder)
    if not held:
        typer.echo(f"No sweep on this machine holds a device now (leases in {folder}).")
        return
    typer.echo(f"Devices held now (leases in {folder}):")
    for device, holder in held:
        if holder is None:
            typer.echo(f"  {device}: held (its holder did not say who it is)")
        else:
            minutes = (time.time() - holder.since) / 60
            typer.echo(f"  {device}: {holder.describe()}, for {minutes:.0f} min")
