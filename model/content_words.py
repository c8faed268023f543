"""Content words of a caption by a rule of English, in a tokenizer's wordpieces: what the `content` MLM policy masks,
what word alignment matches to image tokens, and what the encoder's alignment term reads.

The `content` MLM masking policy hides all wordpieces of one content word per caption. Random masking hides half the
wordpieces, so most masked words are guessed from the caption's grammar. Hiding one
whole content word (a noun, an adjective, a number, a verb, a spatial word) and nothing else leaves the sentence
around it: what fills the gap is something only the image says (which thing, what size, how many, which side).
Content words are every word outside a closed class of English function words (articles, pronouns, auxiliaries,
conjunctions, non-spatial prepositions): no word list of any world, so it applies to any caption.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

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


def content_word_slots(words: ContentWords, input_ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] the slot (0, 1, ... in caption order) of the content word each caption position belongs to; -1 elsewhere."""
    word, start = words.content_words(input_ids, text_mask)
    rank = torch.cumsum(start.long(), 1) - 1
    # A word's index (word, 1..) to its slot, read back at every piece of the word.
    slot_of_word = torch.full((word.shape[0], word.shape[1] + 1), -1, dtype=torch.long, device=word.device)
    slot_of_word.scatter_(1, torch.where(start, word, 0), torch.where(start, rank, -1))
    return slot_of_word.gather(1, word)  # word 0, outside the caption, reads -1


def best_cosines(word_vecs: torch.Tensor, image_tokens: torch.Tensor, paired: bool = False) -> torch.Tensor:
    """Each caption word's best cosine over an image's tokens (word_vecs [B, W, h], tokens [B', n, h]): over every
    image, [B, W, B']; paired (B' == B), over its own image alone, [B, W]."""
    words, tokens = F.normalize(word_vecs, dim=-1), F.normalize(image_tokens.to(word_vecs.dtype), dim=-1)
    return torch.einsum("iwh,ith->iwt" if paired else "iwh,jth->iwjt", words, tokens).amax(-1)


def mean_over_words(best: torch.Tensor, word_valid: torch.Tensor) -> torch.Tensor:
    """The mean over each caption's valid words (word_valid [B, W]) of `best` [B, W, ...]; 0 for a caption without."""
    valid = word_valid.to(best.dtype).reshape(*word_valid.shape, *([1] * (best.dim() - 2)))
    return (best * valid).sum(1) / valid.sum(1).clamp_min(1)
