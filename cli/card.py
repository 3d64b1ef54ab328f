"""``hf-geonorm card``: write the GeoNorm model card of a folder another tool saved
(hf_geonorm.sharing.card_updates.write_card_for), and the checks of the card facts a command is given."""

from __future__ import annotations

import click

from .command_options import CardOptions
from .errors import cannot_write
from .options import options_from


def check_card_options(license_: str | None, license_name: str | None, base_model: str | None,
                        local_hint: str) -> None:  # fmt: skip
    """The card facts given on the command line, checked as push checks them, before anything is read or written."""
    from hf_geonorm.sharing.card_metadata import base_model_option_problem, license_option_problem

    problem = license_option_problem(license_, license_name)
    if problem is None and base_model is not None:
        problem = base_model_option_problem(base_model, local_hint)
    if problem:
        raise click.UsageError(problem)


@click.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@options_from(CardOptions)
def card(path: str, base_model: str | None, license: str | None, license_name: str | None, source: str | None,
         from_folder: str | None, force: bool) -> None:  # fmt: skip
    """Write the GeoNorm model card (README.md and geonorm_card.json) of the GeoNorm folder PATH that another tool
    saved: run_clm.py's Trainer writes its generic card, TRL's SFTTrainer none, and `hf-geonorm push` needs a
    GeoNorm card. Facts already stored in PATH are kept; the options add to them. Each file is written whole.
    Its Training section says what the other tool left: trainer_state.json (PATH's, else its newest checkpoint's) is
    read; training_args.bin, a pickle, is never loaded; where neither is there, the training is called unknown.

    A README.md that hf-geonorm did not write as it is (you edited it, or another tool wrote it) is never replaced:
    without --force the command stops, and with it only the README's metadata changes, its text is kept."""
    from hf_geonorm.sharing.card_updates import write_card_for
    from hf_geonorm.sharing.model_card import CardInfo, inherited_card_info

    check_card_options(license, license_name, base_model, "name a local folder with --source")
    facts = inherited_card_info(from_folder) if from_folder else CardInfo()
    given = {"base_model": base_model, "license": license, "source": source}
    given = {key: value for key, value in given.items() if value is not None}
    if license is not None:
        given.update(license_name=license_name, license_link=None)
    facts = CardInfo.from_dict({**facts.to_dict(), **given})
    try:
        written = write_card_for(path, facts, force=force)
    except OSError as error:
        raise cannot_write(path, error) from None
    data = written.readme.with_name("geonorm_card.json")
    if written.text_kept:
        click.echo(f"updated the metadata of {written.readme}, its text kept, and wrote {data} (move README.md "
                   "away and run hf-geonorm card again for the whole GeoNorm card)")  # fmt: skip
    else:
        click.echo(f"wrote {written.readme} and {data}")
