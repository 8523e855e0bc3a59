"""`protofed partition` and `protofed embed`: a config's partition, and t-SNE figures of a
run's embeddings or prototypes (docs/figures.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from protofed.cli.common import (
    ConfigFile,
    DataDir,
    Overrides,
    console,
    experiment_config,
    file_prefix,
    user_errors,
)

StyleOption = Annotated[
    str,
    typer.Option(
        "--style",
        help="screen, paper (one column, 3.3 in) or paper-wide (7 in): the figure's size "
        "and fonts (docs/figures.md).",
    ),
]
TitleOption = Annotated[
    str | None, typer.Option("--title", help="The figure's title; '' for none.")
]


def partition(
    config: ConfigFile = None,
    set_: Overrides = [],  # noqa: B006
    data_dir: DataDir = None,
    plot: Annotated[
        bool, typer.Option("--plot", help="Also draw the heat map (OUT.png, OUT.pdf).")
    ] = False,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="--plot: file prefix of the figure.")
    ] = Path("partition"),
    style: StyleOption = "screen",
    title: TitleOption = None,
) -> None:
    """Print the clients x classes count matrix of a config's partition (no training)."""
    from protofed.data import build_federated
    from protofed.errors import ConfigError
    from protofed.plots import get_style

    with user_errors():
        if plot:
            out = file_prefix(out, "partition")
            get_style(style)  # a bad style fails before the data are read
        elif style != "screen" or title is not None:
            raise ConfigError("--style and --title draw the heat map: add --plot")
        cfg = experiment_config(config, set_, data_dir)
        fed = build_federated(cfg.data, cfg.seed)
        console.print(fed.counts_table(), highlight=False)
        if plot:
            from protofed.plots import save_figure
            from protofed.plots.heatmap import partition_figure

            paths = save_figure(partition_figure(fed, title, style=style), out)
            console.print(f"wrote {' and '.join(map(str, paths))}", highlight=False)


def embed(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    client: Annotated[int, typer.Option("--client", help="Whose personalized model.")] = 0,
    other: Annotated[int, typer.Option("--other", help="How many other clients' data.")] = 3,
    other_data: Annotated[
        str | None,
        typer.Option(
            "--other-data",
            help="Instead of other clients: one user's windows of this other HAR data set "
            "(FedAli's Fig. 4).",
        ),
    ] = None,
    with_clients: Annotated[
        list[int] | None,
        typer.Option("--with", help="These other clients (repeat it), instead of --other's."),
    ] = None,
    own_models: Annotated[
        bool,
        typer.Option(
            "--own-models",
            help="Each client's own model on its own training data (FedAli's Fig. 5).",
        ),
    ] = False,
    pooled: Annotated[
        bool,
        typer.Option(
            "--pooled",
            help="The encoder's pooled output before the embedding layer (hart: 192-d, where "
            "FedAli's official code draws Figs. 4-5), instead of the embedding.",
        ),
    ] = False,
    prototypes: Annotated[
        bool,
        typer.Option("--prototypes", help="t-SNE of the prototypes the run kept, instead."),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="File prefix (default: embed_client<K> or embed_prototypes)."
        ),
    ] = None,
    data_dir: DataDir = None,
    style: StyleOption = "screen",
    title: TitleOption = None,
) -> None:
    """t-SNE of a client's personalized embeddings of its own and other clients' test data
    (or another HAR data set's windows), or (--prototypes) of the class prototypes kept
    across rounds (docs/figures.md)."""
    with user_errors():
        from protofed.api import Run
        from protofed.plots import get_style, save_figure
        from protofed.plots.embed import draw_embedding, embedding_map, prototype_figure

        if out is not None:
            out = file_prefix(out, "embed")
        chosen = get_style(style)  # a bad style fails before the t-SNE
        run_ = Run(run_dir)
        said = ""
        if prototypes:
            fig = prototype_figure(run_, style=chosen, title=title)
            default = "embed_prototypes"
        else:
            m = embedding_map(
                run_,
                client,
                other,
                data_dir=data_dir,
                other_data=other_data,
                pick=with_clients,
                own_models=own_models,
                pooled=pooled,
            )
            fig = draw_embedding(m, style=chosen, title=title)
            default = f"embed_client{client}" + ("_own_models" if own_models else "")
            if m.agreement == m.agreement:  # not NaN: there are other points
                said = f" (the others' nearest own point of their class: {100 * m.agreement:.1f} %)"
        paths = save_figure(fig, out if out is not None else Path(default))
    console.print(f"wrote {' and '.join(map(str, paths))}{said}", highlight=False)
