"""``hf-geonorm push``: upload a GeoNorm folder to the Hugging Face Hub (hf_geonorm.sharing.hub.push_folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .command_options import PushCommandOptions
from .errors import first_line
from .options import options_from


def _size(path: Path, files: list[str]) -> str:
    total = sum((path / name).stat().st_size for name in files)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if total >= scale:
            return f"{total / scale:.1f} {unit}"
    return f"{total} bytes"


@click.command()
@click.argument("path", type=click.Path(file_okay=True, dir_okay=True))
@click.argument("repo_id")
@options_from(PushCommandOptions)
def push(path: str, repo_id: str, **kwargs: Any) -> None:
    """Upload the GeoNorm folder PATH to the Hub model repository REPO_ID (namespace/name).

    PATH must be complete: safetensors weights, a config.json of a geonorm_<type> model, the remote code its
    auto_map names (so it loads with trust_remote_code=True where hf-geonorm is not installed) and a README.md
    model card with valid metadata -- what `hf-geonorm convert` and the final folder of `hf-geonorm train` hold.
    Nothing is sent otherwise. The repository is created when missing. The token is the usual Hugging Face
    login (HF_TOKEN, or `hf auth login`); HF_ENDPOINT selects another Hub. The card's placeholder repository id
    in its loading examples becomes REPO_ID; hidden files, byte code and Trainer state are not uploaded.
    """
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    from hf_geonorm.sharing.hub import NotShareable, PushOptions, push_folder, shareable_files

    if kwargs["create_pr"] and kwargs["revision"] and kwargs["revision"] != "main":
        raise click.UsageError("--create-pr opens a pull request against main; it cannot be combined with --revision")
    folder = Path(path)
    try:
        if folder.is_dir():
            files = shareable_files(folder)
            click.echo(f"checking {path}: {len(files)} files, {_size(folder, files)}", err=True)
        result = push_folder(folder, repo_id, PushOptions(**{**kwargs, "private": kwargs["private"] or None}))
    except NotShareable as error:
        raise click.ClickException(f"not pushed: {error}") from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        lines = (error.server_message or str(error)).strip().splitlines() or [type(error).__name__]
        hint = " (is the token valid, with write access?)" if status in (401, 403) else ""
        raise click.ClickException(f"the Hub refused the push ({status}): {lines[0][:300]}{hint}") from None
    except (OSError, RuntimeError) as error:  # connection errors are OSErrors (httpx ConnectError is not)
        raise click.ClickException(f"push to {constants.ENDPOINT} failed: {first_line(error)}") from None
    except Exception as error:
        if type(error).__module__.startswith(("httpx", "httpcore")):
            raise click.ClickException(f"cannot reach the Hub at {constants.ENDPOINT}: {first_line(error)}") from None
        raise
    where = f"a pull request {result.pr_url}" if result.pr_url else f"{result.repo_id} ({result.revision})"
    click.echo(f"pushed {len(result.files)} files to {where}: {', '.join(result.files)}")
    click.echo(f"commit {result.commit_oid}: {result.commit_url}")
    if result.modified_code:
        click.echo(f"with modified remote code ({', '.join(result.modified_code)}); the card says so", err=True)
