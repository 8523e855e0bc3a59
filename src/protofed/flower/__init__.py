"""protofed on Flower: every registered algorithm as a Flower ServerApp and ClientApp.

- `wire`: arrays, metrics and the task as Flower records (no pickle);
- `validation`: the server's check of every reply;
- `clientapp`: the ClientApp (any algorithm's client side; state in `Context.state`);
- `transport`: `FlowerTransport`, the round loop's messages and replies over Flower's Grid;
- `simulation`: the loop on Flower's simulation engine (`protofed run --engine flower`),
  with `session` for its process side (Ray, signals, clean-up) and `settings` for the
  `flower.*` checks;
- `deployment`: the deployed loop (`deploy`) and its client-side evaluation;
- `serverapp`: the deployed ServerApp (`flwr run flower_app <superlink>`);
- `partitions`: one client's data per file for the SuperNodes
  (`protofed flower export CONFIG --out DIR`).

Flower is an optional extra: `pip install protofed[flower]`. See docs/flower.md.
"""

from __future__ import annotations

from protofed.errors import ConfigError


def require_flower() -> None:
    """A one-line error (not a traceback) when the extra is missing."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the Flower engine needs the flower extra: pip install 'protofed[flower]'"
        ) from None
