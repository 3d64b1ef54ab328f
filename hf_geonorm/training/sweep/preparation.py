"""What a sweep does once before its runs, on every machine that trains them: the data's and the tokenizer's
fingerprints (what the journal's header keys the data by), and the data tokenized and cached, so that each run reads
it as every other does and the time estimate measures runs alike."""

from __future__ import annotations

import time
from typing import Any

from ..options import TrainOptions


def prepared_data_key(train: TrainOptions, log: Any) -> dict[str, str]:
    """The fingerprints of ``train``'s data and tokenizer, the data cached on the way (a stream is read by each run
    alike, so it is not)."""
    from ..data.prepare import data_request, data_source, training_data

    started = time.monotonic()
    request = data_request(train)
    source = data_source(request, lambda _: None)
    data_key = {"fingerprint": source.corpus.fingerprint, "tokenizer": source.tokenizer_hash}
    if not train.streaming:
        training_data(source, request, lambda _: None)
        log(f"data prepared in {time.monotonic() - started:.0f} s, before the first run: tokenized and cached, as "
            "every run reads it")  # fmt: skip
    return data_key
