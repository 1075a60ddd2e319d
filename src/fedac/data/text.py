"""Character vocabulary of the CTC speech-recognition task: transcripts <-> target ids.

LibriSpeech transcripts are upper-case letters, apostrophes and single spaces; the CTC head predicts
lower-case characters (a-z, apostrophe, space) with index 0 reserved for the CTC blank.
"""

from __future__ import annotations

BLANK = 0
VOCAB: tuple[str, ...] = ("<blank>", " ", "'", *"abcdefghijklmnopqrstuvwxyz")
_INDEX = {ch: i for i, ch in enumerate(VOCAB) if i != BLANK}


def normalize_transcript(text: str) -> str:
    """Lower case, single spaces, no leading or trailing space."""
    return " ".join(text.lower().split())


def unknown_characters(text: str) -> set[str]:
    """Characters of a (normalised) transcript that the vocabulary cannot express."""
    return {ch for ch in normalize_transcript(text) if ch not in _INDEX}


def encode(text: str) -> list[int]:
    """Target ids of a transcript (normalised first); raises KeyError on a character outside
    VOCAB."""
    return [_INDEX[ch] for ch in normalize_transcript(text)]


def decode(ids) -> str:
    """Ids (blanks already removed or not) -> text, blanks dropped."""
    return "".join(VOCAB[int(i)] for i in ids if int(i) != BLANK)


def greedy_ctc(frame_ids) -> str:
    """Best-path CTC decoding: collapse repeated frame labels, then drop blanks."""
    out, previous = [], None
    for i in frame_ids:
        i = int(i)
        if i != previous and i != BLANK:
            out.append(i)
        previous = i
    return normalize_transcript(decode(out))
