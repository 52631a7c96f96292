"""Statements for new, unlabelled cases with finite-sample guarantees from labelled calibration cases (cases are the
exchangeable units; ../shared/reference/new_case_statements.md; docs/new_cases.md):

* :mod:`~mcseg.statements.quantiles`: the split-conformal quantile, Tibshirani et al.'s weighted quantile and the
  effective sample size of the weights.
* :mod:`~mcseg.statements.features`: per case and structure, what the prediction says without a label (volumes in
  mL, the Poisson-binomial spread, the soft self-Dice, the probability band's width in mm; with members, the spread
  of their volumes) and, given a label, the truth those statements are about (volume, Dice, HD95).
* :mod:`~mcseg.statements.intervals`: a structure's volume with an interval, a lower bound on its Dice and an upper
  bound on its HD95 (split conformal, plain or weighted).
* :mod:`~mcseg.statements.review`: the review flag, "flag when the risk score exceeds s", s chosen by
  Learn-then-Test so that the failure rate among the cases not flagged is <= alpha with probability >= 1 - delta.
* :mod:`~mcseg.statements.shift`: density-ratio weights between calibration and new cases from a cross-fitted
  classifier on label-free case features (weighted conformal prediction under covariate shift).
* :mod:`~mcseg.statements.validity`: the guarantees checked over many random calibration / test splits.
* :mod:`~mcseg.statements.shift_validity`: the plain and the weighted statements under shift over many random
  calibration draws.

Entry point: ``mcseg-new-cases`` (:mod:`mcseg.new_cases`).
"""
