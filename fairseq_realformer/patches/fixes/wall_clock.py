"""A resumed fairseq-train's wall clock stays at 0."""

import functools


def restart_wall_clock(load_checkpoint):
    """A resumed fairseq-train logs ``wall=0`` on every line, a defect of fairseq itself: its
    "wall" meter is a ``StopwatchMeter`` (``metrics.log_start_time("wall")`` in
    ``Trainer.__init__``, never stopped), and ``Trainer.load_checkpoint`` loads the checkpoint's
    meters, which leaves it stopped (``start_time`` None: elapsed time 0). Right after, fairseq
    restarts only its ``TimeMeter``s ("since their start times don't make sense anymore"), the
    kind "wall" was in older fairseq. Restart the stopped wall clock the same way: after a resume,
    ``wall`` counts the seconds since the checkpoint was loaded, as it counts from the start of a
    fresh run. A wall clock that runs (a fresh run, any other meter) is left alone. (No fairseq
    issue found.)

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer)``, which calls ``trainer.load_checkpoint``.

    A stock ``transformer`` run: the same; only the ``wall`` column of a resumed run's log
    changes (it counts again instead of reading 0)."""
    from fairseq.logging import meters, metrics

    @functools.wraps(load_checkpoint)
    def load_checkpoint_restarting_the_wall_clock(*args, **kwargs):
        loaded = load_checkpoint(*args, **kwargs)
        wall = metrics.get_meter("default", "wall")
        if isinstance(wall, meters.StopwatchMeter) and wall.start_time is None:
            wall.start()
        return loaded

    return load_checkpoint_restarting_the_wall_clock
