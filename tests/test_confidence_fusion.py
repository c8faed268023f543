"""The confidence-switched fusion study (research/confidence_fusion.py): on scores built so that the first stage misleads
exactly where it is unsure, the fitted switch trusts it less there, and its figures split by template as evaluate's do."""
from __future__ import annotations

import numpy as np

from edje.research.confidence_fusion import Capture, fit_form, fit_global, fit_switch, function_share, report


def _capture(rng, n=400, k=5, held=None):
    """Query q's answer is image q. Confident queries (margin 1/4): the first stage ranks the answer first, the ITM
    ranks it below a wrong one by 1.5, which a weight of 8 overturns and 4 does not. Unsure ones (margin 1/128): the
    first stage ranks a wrong image first, the ITM prefers the answer by 0.05, which a weight of 4 keeps and 8 does
    not. So no one weight ranks both right. Cosines are multiples of 1/1024: the margins are exact in float32."""
    unsure = np.arange(n) % 2 == 1
    sim = np.sort(rng.integers(205, 400, (n, k)) / 1024, axis=1)[:, ::-1].copy()
    sim[:, 0] = sim[:, 1] + np.where(unsure, 1 / 128, 1 / 4)
    idx = np.tile(np.arange(n, n + k), (n, 1))
    answer_at = np.where(unsure, 1, 0)
    idx[np.arange(n), answer_at] = np.arange(n)
    itm = np.zeros((n, k))
    itm[np.arange(n), answer_at] = np.where(unsure, 0.05, -1.5)
    answers = [np.array([q]) for q in range(n)]
    return Capture(sim.astype(np.float32), idx, itm.astype(np.float32), answers, None, held, None)


def test_the_switch_trusts_an_unsure_first_stage_less_and_beats_one_weight():
    rng = np.random.default_rng(0)
    fit = _capture(rng)
    one = fit_global(fit)
    switch = fit_switch(fit, "margin")
    assert switch["w_lo"] <= 4 < 8 <= switch["w_hi"] and switch["fit_r1"] == 100.0 > 50.0 == one["fit_r1"]
    held = np.arange(400) % 2 == 1  # the unsure queries play the held-out templates
    test = _capture(np.random.default_rng(1), held=held)
    by_switch, by_one = report(test, switch), report(test, one)
    assert by_switch["all"]["r1"] == 100.0 > by_one["all"]["r1"]
    assert by_switch["held_out_below_threshold"] == 1.0 and by_switch["training_below_threshold"] == 0.0
    assert by_switch["held_out_templates"]["queries"] == by_switch["training_templates"]["queries"] == 200


def test_the_form_switch_reads_a_querys_share_of_function_words():
    assert function_share("a small dog to the left of a cat") == 5 / 9  # a, to, the, of, a
    assert function_share("dog (small, facing left)") == 0.0 and function_share("") == 0.0
    # The margin capture again, with its unsure queries written terse. One weight of 8 ranks the sentences right and
    # the terse queries wrong; a form weight of 4 or less below a share between theirs ranks them right too.
    fit = _capture(np.random.default_rng(0))
    fit.texts = ["dog (small) left of cat" if q % 2 else "a dog to the left of a cat" for q in range(400)]
    eight = {"feature": None, "w_lo": 8.0, "w_hi": 8.0, "threshold": 0.0, "fit_r1": None}
    assert report(fit, eight)["all"]["r1"] == 50.0
    form = fit_form(fit, eight)
    assert form["w_form"] <= 4 and 0.2 < form["form_threshold"] <= 0.625 and form["fit_r1"] == 100.0
    assert report(fit, form)["all"]["r1"] == 100.0
    # Where no form weight raises R@1, the rule stays as it was.
    fit.texts = ["a dog to the left of a cat"] * 400
    assert fit_form(fit, eight)["form_threshold"] is None
