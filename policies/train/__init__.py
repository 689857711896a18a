"""Training the learned draft-length policies in replay: ``python -m harness task=train`` (harness/tasks/train.py;
``python -m policies.train`` is an alias, ``__main__``).

pipeline (the stages in order: traces → profile → γ policy → size rounds → live fine-tuning), ppo (the PPO
model, its files, the evaluation callback, the γ policy in training), size (the verification-size rounds), live
(live fine-tuning), calibrate (a profile to the grid), tuning (the rules' parameters in replay), fit_classifier
(``python -m policies.train.fit_classifier``).
"""
