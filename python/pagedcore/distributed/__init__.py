"""Running one model over several processes: tensor, pipeline and data parallelism (docs/distributed.md).

    rank.py            RankInfo, ParallelLayout: who is who (rank = pp_rank * tp_size + tp_rank)
    communicator.py    Communicator (the TP all-reduce) and Channel (one writer, n readers) interfaces
    errors.py          WorkerDiedError, PeerDiedError: a rank that is gone fails the engine, never hangs it
"""
