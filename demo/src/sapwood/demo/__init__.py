"""sapwood.demo: the end-to-end demo application (``sapwood demo``, extra ``demo``).

A tiny agent learns the key-recall task with asynchronous single-rollout RL while every model call
is recorded through the recorder SDK (:mod:`sapwood.rollout`) and trained on by the learner:

* :mod:`~sapwood.demo.tasks` — the key-recall task family (environment, teacher, noise);
* :mod:`~sapwood.demo.worker` — the agent loop (:func:`run_execution`) and rollout worker threads;
* :mod:`~sapwood.demo.pretrain` — supervised pre-training (policy version 0);
* :mod:`~sapwood.demo.config`, :mod:`~sapwood.demo.phases`, :mod:`~sapwood.demo.threads`,
  :mod:`~sapwood.demo.driver`, :mod:`~sapwood.demo.summary`, :mod:`~sapwood.demo.plots` — one run;
* :mod:`~sapwood.demo.ablations` — arms side by side over seeds; :mod:`~sapwood.demo.cli` — the command.

Nothing is imported here, so ``import sapwood.demo.cli`` stays light (typer and rich only).
"""
