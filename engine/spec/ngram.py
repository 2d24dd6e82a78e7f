"""N-gram prompt lookup (vLLM's ``ngram`` method, llama.cpp's ``--lookup``): the tokens that followed the latest
earlier occurrence of the sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min) are the
proposal. Costs no model: a byte search over the token ids (C speed, bytes.rfind on their int32 encoding)."""

from __future__ import annotations

from array import array


def ngram_proposal(tokens: list[int], k: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix of ``tokens`` (of
    lookup_max down to lookup_min tokens) found earlier in ``tokens``; [] where none is found."""
    n_tok = len(tokens)
    if k <= 0 or n_tok < lookup_min + 1:
        return []
    data = array("i", tokens).tobytes()
    for n in range(min(lookup_max, n_tok - 1), lookup_min - 1, -1):
        pattern = data[-4 * n:]
        end = len(data) - 4  # an occurrence must end before the suffix itself does
        while True:
            at = data.rfind(pattern, 0, end)
            if at < 0:
                break
            if at % 4 == 0:  # aligned on a token: a true occurrence
                first = at // 4 + n
                return tokens[first:first + k]
            end = at + len(pattern) - 1
    return []


class NgramProposer:
    """The ``ngram`` proposer: each request's own tokens (prompt and output) are its lookup table."""

    free = True  # a lookup costs nothing: the decoder's back-off drops proposals rather than skipping steps

    def __init__(self, lookup_max: int, lookup_min: int):
        self.lookup_max = lookup_max
        self.lookup_min = lookup_min

    def propose(self, reqs: list, limits: list[int]) -> list[list[int]]:
        return [ngram_proposal(r.all_token_ids, k, self.lookup_max, self.lookup_min) if k > 0 else []
                for r, k in zip(reqs, limits)]

    def remove(self, request_id: str) -> None:
        pass
