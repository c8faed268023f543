"""The `content` MLM masking policy: all wordpieces of one content word per caption, by a rule of English.

Random masking hides half the wordpieces, so most masked words are guessed from the caption's grammar. Hiding one
whole content word (a noun, an adjective, a number, a verb, a spatial word) and nothing else leaves the sentence
around it: what fills the gap is something only the image says (which thing, what size, how many, which side).
Content words are every word outside a closed class of English function words (articles, pronouns, auxiliaries,
conjunctions, non-spatial prepositions): no word list of any world, so it applies to any caption.
"""
from __future__ import annotations

from typing import Optional

import torch

# The closed classes of English: a language's grammar words, not its vocabulary. Spatial words ("left", "above",
# "under", "between", "near") and numerals stay content: a caption's layout and counts are what the image must
# supply.
FUNCTION_WORDS = frozenset("""
a an the this that these those some any each every either neither no another other such what which whose
i me my mine you your yours he him his she her hers it its we us our ours they them their theirs
myself yourself himself herself itself ourselves themselves there here who whom whoever whatever
am is are was were be been being has have had having do does did doing will would shall should can could may
might must 's
and or but nor so yet if then than as because while whereas although though when where whether
of to in on at by for with from into onto upon about against among through during without within via per
like unlike besides
not also just very too quite rather only both all
""".split())


class ContentWords:
    """Per wordpiece id of a tokenizer: whether it continues a word, starts an alphabetic word, is a function word."""

    def __init__(self, tokenizer):
        n = max(len(tokenizer), tokenizer.vocab_size)
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        special = set(tokenizer.all_special_tokens)
        # WordPiece marks a word's later pieces with "##" (BERT and MiniLM vocabularies).
        self.continues = torch.tensor([p is not None and p.startswith("##") for p in pieces])
        self.alpha = torch.tensor([p is not None and p.isalpha() and p not in special for p in pieces])
        self.function = torch.tensor([p is not None and p.lower() in FUNCTION_WORDS for p in pieces])

    def content_words(self, input_ids: torch.Tensor, text_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(word index [B, T] of each caption position, 0 outside the caption; content word starts [B, T] bool)."""
        cont = self.continues.to(input_ids.device)[input_ids] & text_mask
        start = text_mask & ~cont
        word = torch.cumsum(start.long(), 1) * text_mask
        # A word of several pieces is never a function word ("a" + "##ard##vark" is not the article).
        multi = torch.zeros_like(start)
        multi[:, :-1] = start[:, :-1] & cont[:, 1:]
        alpha = self.alpha.to(input_ids.device)[input_ids]
        function = self.function.to(input_ids.device)[input_ids]
        return word, start & alpha & (multi | ~function)

    def mask_policy(self, batch, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """`JointEncoder.mlm_logits` mask policy: every piece of one content word per caption, drawn uniformly;
        nothing in a caption without one."""
        word, content = self.content_words(batch.input_ids, batch.text_mask)
        draw = torch.rand(content.shape, generator=generator).to(content.device).masked_fill(~content, -1.0)
        pick = draw.argmax(1)
        chosen = word.gather(1, pick[:, None])
        return (word == chosen) & content.any(1, keepdim=True) & batch.text_mask

    @staticmethod
    def readout_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Share of masked content-word pieces predicted exactly (argmax over the whole vocabulary)."""
        keep = labels != -100
        return (logits[keep].argmax(-1) == labels[keep]).float().mean() if keep.any() else logits.new_zeros(())
