"""Constrained decoding of removals: a delta may only remove what the current state holds.

The commonest way a completion fails to parse is a removal of an item the state does not have
("cannot remove 'knife (on table)' from visible: it is not there"): the model half-remembers an
item of another game. While the model writes a removal (`-...` in a `visible:`, `inventory:` or
`actions:` line of the next state), this logits processor lets through only the tokens that keep
the entry a prefix of an item of that field in the current state (not yet removed on the line),
named as the format names removals (by its name, `format.removal_texts`), followed by the
separator or the line's end.

The next commonest failures repeat an item: an addition of what the field already holds or the
line already added, or a replacement line (`visible = ...`) naming an item twice. While the model
writes such an entry, a token that would end it (with the separator or the line's end) on a
repeated item is masked, so the model must write a different item or go on with this one.

A next state may also name a worked example (`same as example i`, experience.copy_examples); the
model sometimes names one whose change does not fit this state (it removes what the state lacks).
While the next state's first line heads for a reference, only the examples whose change applies to
the current state may be named; when none applies, the model must write the change out. Where one
applies, the model may still write a change out: holding it to a fitting reference or `no change`
there (`examples_first`) lowered GRPO's real score in a tiny dream, and was removed (measured:
results log, 2026-11-28).

The model writes its reasoning first, and a long next state in between sometimes makes it forget
what the reasoning said: "The task is lost and the episode ends." then `<done>false</done>`. When
the reasoning states the score and the end in the default annotator's words
(`annotate.stated_outcome`), itself or by naming a worked example whose trace does, the reward and
done after the next state are held to what it said; and when it says whether anything changed
(`annotate.stated_change`), the next state is `no change` exactly when it said nothing did. Out of
its data the model otherwise copies an example's trace, "Effects: fridge is now open; ...", and
then writes `no change` (measured: results log, 2026-11-26).
Out of its data (a place, a thing or a move it never saw) the model also loses the format itself:
it opens a second `<next_state>`, writes `actions:` twice or runs an entry into the next tag. So
the completion is kept a prefix of the format's language (`completion_pattern`: the sections in
order, a next state that is `no change`, a reference or field lines in the state's order with
`+item` / `-item` entries or a replacement, a number, `true` or `false`), compiled once into a
token automaton (outlines-core) that says which tokens keep it so. Greedy decoding takes the
best-scored of them (the model's own choice nearly always is one); sampling draws among those of the
top `FORMAT_CANDIDATES` tokens that do.
Where no token keeps it so (the other rules masked each one that would), the completion ends there:
it could not parse, and writing on to `max_new_tokens` held up its batch.
Everything else the model writes freely; the strict parser still reads the result.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import regex
import torch

from dreamgym.experience.annotate import stated_change, stated_outcome
from dreamgym.experience.format import (
    NO_CHANGE,
    SAME_AS,
    FormatError,
    fits,
    format_number,
    removal_texts,
    resolve_reference,
)
from dreamgym.state import ITEM_PATTERN, ITEM_SEPARATOR, AbstractState

_OPEN = "<next_state>\n"
_CLOSE = "</next_state>"
_LIST_LINE = re.compile(r"(visible|inventory|actions)(:| =) (.*)")  # a change line or a replacement line
_ENTRY_END = re.compile(r";|\n")
_REFERENCE = SAME_AS.split("{")[0]  # what every reference starts with: "same as example "
_REASONING = re.compile(r"<reasoning>(.*?)</reasoning>", re.DOTALL)
# Sampling draws among those of the best-scored tokens that keep the completion in the format.
FORMAT_CANDIDATES = 32


def completion_pattern(reasoning: bool) -> regex.Pattern:
    """The completions format.py writes, as a pattern whose partial matches are their prefixes.
    What only the state can tell (which items may be removed or added, which example fits) is
    left to the other rules and the parser."""
    item = ITEM_PATTERN
    entries = rf"{item}(?:; {item})*"
    changes = rf"[+-]{item}(?:; [+-]{item})*"
    lines = [rf"location: {item}"]
    lines += [rf"{name}(?:: {changes}| =(?: {entries})?)" for name in ("visible", "inventory", "actions")]
    # One line per field, in the state's order, at least one.
    delta = "|".join("".join([lines[first], *(rf"(?:\n{line})?" for line in lines[first + 1 :])]) for first in range(4))
    number = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
    head = r"<reasoning>[^<]+</reasoning>\n" if reasoning else ""
    return regex.compile(
        rf"{head}<next_state>\n(?:no change|same as example [1-9][0-9]*|{delta})\n</next_state>\n"
        rf"<reward>{number}</reward>\n<done>(?:true|false)</done>"
    )


def _list_line(generated: str) -> tuple[str, str, list[str]] | None:
    """(field, ':' for a change line or ' =' for a replacement, its entries so far) when
    `generated` ends on a list field's line of the next state; None anywhere else."""
    start = generated.rfind(_OPEN)
    if start < 0 or _CLOSE in generated[start:]:
        return None
    match = _LIST_LINE.fullmatch(generated[start + len(_OPEN) :].rsplit("\n", 1)[-1])
    return (match[1], match[2], match[3].split(ITEM_SEPARATOR)) if match else None


def allowed_removals(state: AbstractState, generated: str) -> tuple[str, list[str]] | None:
    """(the removal written so far, the texts it may still become) when `generated` ends inside a
    removal entry of a list field's change line; None anywhere else."""
    return _removal(state, _list_line(generated))


def repeated_entries(state: AbstractState, generated: str) -> tuple[str, set[str]] | None:
    """(the addition or replacement entry written so far, the items it must not end as) when
    `generated` ends inside such an entry of a list field's line; None anywhere else."""
    return _repeat(state, _list_line(generated))


def fitting_references(state: AbstractState, examples: Sequence[str]) -> list[str]:
    """The references (`same as example i`) whose example's change applies to `state`."""
    return [SAME_AS.format(number) for number, changes in enumerate(examples, start=1) if fits(state, changes)]


def _reference_line(generated: str) -> str | None:
    """The next state's first line written so far, when `generated` ends on it; None elsewhere."""
    start = generated.rfind(_OPEN)
    if start < 0:
        return None
    written = generated[start + len(_OPEN) :]
    return None if "\n" in written else written


def _heads_for_reference(text: str) -> bool:
    return bool(text) and (_REFERENCE.startswith(text) or text.startswith(_REFERENCE))


def _stated_trace(generated: str, end: int, traces: Sequence[str | None]) -> str | None:
    """The reasoning written before `end`, or the trace of the worked example it names."""
    reasoning = _REASONING.search(generated, 0, end)
    if reasoning is None:
        return None
    try:
        return resolve_reference(reasoning[1].strip(), traces, "reasoning")
    except FormatError:  # it names an example the prompt lacks: the parser will say so
        return None


def stated_first_line(generated: str, traces: Sequence[str | None] = ()) -> tuple[str, bool] | None:
    """(the next state's first line so far, whether the reasoning said the state changed) while
    `generated` ends on that line and the reasoning said so (`annotate.stated_change`), itself
    or by naming a worked example whose trace does; None anywhere else."""
    written = _reference_line(generated)
    if written is None:
        return None
    trace = _stated_trace(generated, generated.rfind(_OPEN), traces)
    changed = None if trace is None else stated_change(trace)
    return None if changed is None else (written, changed)


def stated_tail(generated: str, traces: Sequence[str | None] = ()) -> tuple[str, str] | None:
    """(what follows the next state so far, what it must be) once the next state is closed and
    the reasoning stated the outcome (`annotate.stated_outcome`), itself or by naming a worked
    example whose trace (`traces`: `format.example_traces`) does; None anywhere else."""
    closed = generated.find(_CLOSE)
    if closed < 0:  # most steps: the reasoning is read only once the next state is closed
        return None
    trace = _stated_trace(generated, closed, traces)
    if trace is None or (outcome := stated_outcome(trace)) is None:
        return None
    reward, done = outcome
    tail = f"\n<reward>{format_number(reward)}</reward>\n<done>{'true' if done else 'false'}</done>"
    return generated[closed + len(_CLOSE) :], tail


def _removal(state: AbstractState, line: tuple[str, str, list[str]] | None) -> tuple[str, list[str]] | None:
    if line is None or line[1] != ":" or not line[2][-1].startswith("-"):
        return None
    field, _, entries = line
    removed = {entry[1:] for entry in entries[:-1] if entry.startswith("-")}
    # As the writer names them (format.removal_texts): by name, in full where a name repeats.
    items = [text for text in removal_texts(getattr(state, field)).values() if text not in removed]
    endings = [f"{item}{ITEM_SEPARATOR}" for item in items] + [f"{item}\n" for item in items]
    return entries[-1][1:], endings


def _repeat(state: AbstractState, line: tuple[str, str, list[str]] | None) -> tuple[str, set[str]] | None:
    if line is None:
        return None
    field, kind, entries = line
    if kind == " =":
        return entries[-1], set(entries[:-1])
    if not entries[-1].startswith("+"):
        return None
    added = {entry[1:] for entry in entries[:-1] if entry.startswith("+")}
    return entries[-1][1:], added | set(getattr(state, field))


@dataclass(frozen=True)
class _Vocabulary:
    """What the rules read of a tokenizer's tokens; the same for every batch (`_vocabulary`)."""

    pieces: list[str]  # each token's text ("" for special tokens)
    silent: set[int]  # tokens that write nothing
    by_first: dict[str, list[tuple[int, str]]]  # token pieces by their first character
    by_piece: dict[str, list[int]]  # the tokens of each piece
    sorted_pieces: list[str]  # the pieces that start with a text are a run of these
    longest_piece: int
    enders: list[tuple[int, str]]  # tokens that end an entry, with their piece before the separator or newline


@functools.lru_cache(maxsize=8)
def _vocabulary(tokenizer, size: int) -> _Vocabulary:
    """The tokens of `tokenizer` (of `size`: a tokenizer that grows is read again), read once per
    tokenizer, not per batch (decoding every token for each batch was much of the constraint's
    time: results log, 2026-11-26). Each token's text is decoded
    once: the generated text grows by one piece a step (exact for a byte-level BPE on ASCII
    text) instead of being decoded again at every step."""
    special = set(tokenizer.all_special_ids)
    pieces = ["" if token in special else tokenizer.decode([token]) for token in range(size)]
    by_first: dict[str, list[tuple[int, str]]] = {}
    by_piece: dict[str, list[int]] = {}
    for token, piece in enumerate(pieces):
        if piece:
            by_first.setdefault(piece[0], []).append((token, piece))
            by_piece.setdefault(piece, []).append(token)
    return _Vocabulary(
        pieces=pieces,
        silent={token for token, piece in enumerate(pieces) if not piece},
        by_first=by_first,
        by_piece=by_piece,
        sorted_pieces=sorted(by_piece),
        longest_piece=max(map(len, by_piece), default=0),
        enders=[
            (token, piece[: match.start()]) for token, piece in enumerate(pieces) if (match := _ENTRY_END.search(piece))
        ],
    )


class DeltaConstraint:
    """A `LogitsProcessor` for a batch of prompts whose current states are `states` and whose
    worked examples changed their states by `examples` (`format.example_changes`, per prompt).
    `stated`: the reward and done follow the reasoning (a model trained on `describe_change`
    traces), or the trace of the example it names (`traces`: `format.example_traces`, per
    prompt). `reasoning`: the completions open with a reasoning section; `greedy`: the batch is
    decoded greedily (the format rule then keeps only the best token that fits)."""

    def __init__(
        self,
        tokenizer,
        states: Sequence[AbstractState],
        prompt_length: int,
        examples: Sequence[Sequence[str]] | None = None,
        stated: bool = False,
        traces: Sequence[Sequence[str | None]] | None = None,
        reasoning: bool = True,
        greedy: bool = True,
    ):
        self.states, self.prompt_length, self.stated = list(states), prompt_length, stated
        self.greedy = greedy
        examples = examples if examples is not None else [()] * len(self.states)
        self.traces = traces if traces is not None else [()] * len(self.states)
        # A reference's line ends with the newline before `</next_state>`.
        self.references = [
            [f"{reference}\n" for reference in fitting_references(state, changes)]
            for state, changes in zip(self.states, examples)
        ]
        self.vocabulary = _vocabulary(tokenizer, len(tokenizer))
        self.end = tokenizer.eos_token_id
        self.generated = [""] * len(self.states)
        self.format = _format_index(tokenizer, len(tokenizer), reasoning)
        self.format_states: list[int | None] = [self.format.start] * len(self.states)  # None: off the format
        self.seen = prompt_length
        self._unfitting: dict[tuple[str, tuple[str, ...], int], list[int]] = {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.read(input_ids)
        for row, state in enumerate(self.states):
            if self.stated:
                self._constrain_tail(row, scores)
                self._constrain_change(row, scores)
            self._constrain_reference(row, scores)
            self._constrain_entries(row, state, scores)
        self._constrain_format(scores)  # last: it picks among what the other rules allow
        return scores

    def read(self, input_ids: torch.LongTensor) -> None:
        """Take in the tokens written since the last call (those past `prompt_length` the first
        time): each row's text, and where it stands in the format."""
        for position in range(self.seen, input_ids.shape[1]):
            for row, token in enumerate(input_ids[:, position].tolist()):
                piece = self.vocabulary.pieces[token] if token < len(self.vocabulary.pieces) else ""
                if piece:
                    self.generated[row] += piece
                    self.format_states[row] = self.format.after(self.format_states[row], token)
        self.seen = input_ids.shape[1]

    def _constrain_entries(self, row: int, state: AbstractState, scores: torch.FloatTensor) -> None:
        """No repeated item in an addition or replacement; removals only of what the state has."""
        line = _list_line(self.generated[row])  # parsed once for both rules
        repeated = _repeat(state, line)
        if repeated is not None:
            written, forbidden = repeated
            enders = self.vocabulary.enders
            masked = [token for token, head in enders if token < scores.shape[1] and written + head in forbidden]
            scores[row, masked] = float("-inf")
            return
        found = _removal(state, line)
        if found is not None:
            written, endings = found
            allowed = self._tokens_toward(written, endings, scores.shape[1])
            if allowed:  # no item fits what was written: leave it to the parser to refuse
                _keep_only(scores, row, allowed)

    def _constrain_format(self, scores: torch.FloatTensor) -> None:
        """Keep each completion a prefix of the format (`completion_pattern`): the best-scored
        token that does (greedy), or those of the top `FORMAT_CANDIDATES` that do, else every one
        that does (sampling). A completion that no token keeps in the format (the other rules
        masked every one that would), or that has left it, ends at once: nothing it could go on to
        write would parse, and a row written on to `max_new_tokens` holds up its whole batch
        (measured: results log, 2026-11-28)."""
        writing = []
        for row, state in enumerate(self.format_states):
            if state is None:
                self._end_row(row, scores)
            elif not self.format.complete(state):  # else a row waiting for the batch
                writing.append(row)
        if not writing:
            return
        if self.greedy:
            self._keep_best_fitting(writing, scores)
            return
        for row in writing:
            row_scores = scores[row]
            fitting = self.format.allowed(self.format_states[row], scores.shape[1], scores.device)
            top = torch.topk(row_scores, min(FORMAT_CANDIDATES, scores.shape[1]))
            fits = set(fitting.tolist())
            kept = [
                token
                for score, token in zip(top.values.tolist(), top.indices.tolist())
                if score > float("-inf") and token in fits
            ]
            if not kept:
                kept = fitting[row_scores[fitting] > float("-inf")].tolist()
            if kept:
                _keep_only(scores, row, kept)
            else:
                self._end_row(row, scores)

    def _keep_best_fitting(self, rows: list[int], scores: torch.FloatTensor) -> None:
        """Keep only the best-scored token that stays in the format, in each of `rows` (greedy),
        all rows in a few tensor operations: this runs at every token, and one row at a time it
        was a third of the rules' time in a DreamEnv step's draft checks (and on a GPU each
        operation is a kernel launch)."""
        width = scores.shape[1]
        barred = torch.stack([self.format.barred(self.format_states[row], width, scores.device) for row in rows])
        index = torch.tensor(rows, device=scores.device)
        best, at = scores[index].masked_fill(barred, float("-inf")).max(dim=1)  # the first of equals, as argmax
        scores[index] = float("-inf")
        scores[index, at] = best
        for row, found in zip(rows, (best > float("-inf")).tolist()):
            if not found:
                self._end_row(row, scores)

    def _end_row(self, row: int, scores: torch.FloatTensor) -> None:
        """The row's completion ends here (the end-of-text token); the parser says why it fails."""
        if self.end is not None and self.end < scores.shape[1]:
            scores[row] = float("-inf")  # whatever another rule masked: the end is the one token left
            scores[row, self.end] = 0.0

    def _tokens_toward(self, written: str, endings: Sequence[str], width: int) -> set[int]:
        """The tokens (of the first `width`) that keep `written` on the way to one of `endings`: a
        token whose piece writes a beginning of what an ending still lacks, or all of it and goes on
        (where an ending is already complete, any token that heads for another one).

        Looked up, not tried: the prefixes of each ending's rest in `by_piece`, the pieces that go
        on past it as one run of `sorted_pieces`: trying every token that starts like an ending
        against every ending was most of the constraint's time (measured: results log, 2026-11-26)."""
        rests = [
            ending[len(written) :] for ending in endings if len(ending) > len(written) and ending.startswith(written)
        ]
        if not rests:
            return set()
        vocabulary = self.vocabulary
        if any(written.startswith(ending) for ending in endings if len(ending) <= len(written)):
            following = {rest[0] for rest in rests}
            return {token for char in following for token, _ in vocabulary.by_first.get(char, ()) if token < width}
        tokens: set[int] = set()
        pieces = vocabulary.sorted_pieces
        for rest in rests:
            for end in range(1, min(len(rest), vocabulary.longest_piece) + 1):
                tokens.update(vocabulary.by_piece.get(rest[:end], ()))
            index = bisect.bisect_left(pieces, rest)
            while index < len(pieces) and pieces[index].startswith(rest):
                tokens.update(vocabulary.by_piece[pieces[index]])
                index += 1
        return {token for token in tokens if token < width}

    def _constrain_tail(self, row: int, scores: torch.FloatTensor) -> None:
        """Keep what follows the next state on the way to the reward and done the reasoning
        stated."""
        found = stated_tail(self.generated[row], self.traces[row])
        if found is None:
            return
        written, tail = found
        if not tail.startswith(written) or written == tail:
            return  # it went its own way before the rule could act (or is done): the parser reads it
        allowed = self._tokens_toward(written, [tail], scores.shape[1])
        if allowed:
            _keep_only(scores, row, allowed)

    def _constrain_change(self, row: int, scores: torch.FloatTensor) -> None:
        """The next state is `no change` where the reasoning said nothing changed, and is not
        where it said something did."""
        found = stated_first_line(self.generated[row], self.traces[row])
        unchanged = f"{NO_CHANGE}\n"
        if found is None or not unchanged.startswith(found[0]):
            return  # off the rule's line, or it went its own way before the rule could act
        written, changed = found
        heading = self._tokens_toward(written, [unchanged], scores.shape[1])
        if changed:
            scores[row, list(heading)] = float("-inf")
        elif heading:
            _keep_only(scores, row, heading)

    def _constrain_reference(self, row: int, scores: torch.FloatTensor) -> None:
        """Mask the tokens that would take the first line towards a reference that does not fit."""
        written = _reference_line(self.generated[row])
        endings = self.references[row]
        if written is None or (written and not _heads_for_reference(written)):
            return
        if len(written) >= len(_REFERENCE):  # every token now goes on with a reference: keep those that fit
            allowed = self._tokens_toward(written, endings, scores.shape[1])
            # special tokens write nothing: left to the parser
            _keep_only(scores, row, allowed | self.vocabulary.silent)
            return
        scores[row, self._toward_unfitting(written, tuple(endings), scores.shape[1])] = float("-inf")

    def _toward_unfitting(self, written: str, endings: tuple[str, ...], width: int) -> list[int]:
        """The tokens (of the first `width`) that take `written`, a beginning of a reference, towards
        a reference that is none of `endings`. Kept for the batch: its rows write the same
        reference prefixes with the same fitting examples, and trying each token that goes on with
        the reference's next character was much of the rules' time (measured: results log, 2026-11-30)."""
        key = (written, endings, width)
        if key not in self._unfitting:
            self._unfitting[key] = [
                token
                for token, piece in self.vocabulary.by_first.get(_REFERENCE[len(written)], ())
                if token < width and _heads_for_reference(written + piece) and not _fits(written + piece, endings)
            ]
        return self._unfitting[key]


class _FormatIndex:
    """The format's language (`completion_pattern`) as a token automaton (outlines-core): for each
    state, the tokens whose piece keeps the text a prefix of the language, looked up instead of
    matching the pattern against the whole completion once per token tried, which was most of the
    decoding rules' time; the tokens it allows are the same (measured: results log, 2026-11-28)."""

    def __init__(self, pieces: Sequence[str], end: int | None, pattern: str):
        from outlines_core import Index, Vocabulary  # loaded with the first constrained decoding

        tokens: dict[bytes, list[int]] = {}
        for token, piece in enumerate(pieces):
            if piece and token != end:
                tokens.setdefault(piece.encode(), []).append(token)
        # outlines-core needs an end token; a tokenizer without one gets an id no piece has.
        self.index = Index(pattern, Vocabulary(end if end is not None else len(pieces), tokens))
        self.start = self.index.get_initial_state()
        self._allowed: dict[tuple[int, int, str], torch.Tensor] = {}
        self._barred: dict[tuple[int, int, str], torch.Tensor] = {}

    def after(self, state: int | None, token: int) -> int | None:
        """The state once `token` is written (None: the text has left the format)."""
        return None if state is None else self.index.get_next_state(state, token)

    def complete(self, state: int) -> bool:
        return self.index.is_final_state(state)

    def allowed(self, state: int, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The tokens (of the first `width`) that keep the text in the format from `state`, on the
        scores' `device`: a GPU's scores cannot be indexed by a mask of them on the CPU."""
        key = (state, width, str(device))
        if key not in self._allowed:
            tokens = torch.tensor(sorted(self.index.get_allowed_tokens(state)), dtype=torch.long)
            self._allowed[key] = tokens[tokens < width].to(device)
        return self._allowed[key]

    def barred(self, state: int, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Whether each of the first `width` tokens leaves the format from `state` (a mask)."""
        key = (state, width, str(device))
        if key not in self._barred:
            barred = torch.ones(width, dtype=torch.bool)
            barred[self.allowed(state, width)] = False
            self._barred[key] = barred.to(device)
        return self._barred[key]


@functools.lru_cache(maxsize=8)
def _format_index(tokenizer, size: int, reasoning: bool) -> _FormatIndex:
    """Built once per tokenizer and format (~0.1 s for the tiny model's 1,625 tokens)."""
    pattern = completion_pattern(reasoning).pattern
    return _FormatIndex(_vocabulary(tokenizer, size).pieces, tokenizer.eos_token_id, pattern)


def _keep_only(scores: torch.FloatTensor, row: int, tokens) -> None:
    """Mask every token of `row` but `tokens`."""
    kept = torch.tensor(list(tokens), dtype=torch.long, device=scores.device)
    values = scores[row, kept]
    scores[row] = float("-inf")
    scores[row, kept] = values


def _fits(text: str, endings: Sequence[str]) -> bool:
    """`text` stays on the way to one of `endings`, or completes one and goes on past it."""
    return any(ending.startswith(text) or text.startswith(ending) for ending in endings)
