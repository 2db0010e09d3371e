"""How the description of a trial ends: the objective is stopped from inside, once the probe has what it needs."""


class ProbeDone(BaseException):
    """Raised out of the objective once the probe has seen what it needs (BaseException: not caught by the
    objective's own ``except Exception``)."""
