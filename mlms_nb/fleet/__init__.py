"""Agents (issue 15): mlms agents are Dask distributed workers that advertise their stack (``mlms agent``); the
registry lists them and picks the ones an evaluation's constraints allow (:mod:`~mlms_nb.fleet.constraints`,
:mod:`~mlms_nb.fleet.registry`); :mod:`~mlms_nb.fleet.run` runs evaluations there through the ``dask`` launcher
(:mod:`mlms_nb.launchers.dask_agent`). Dask itself is imported only when an agent, a scheduler or a client is made."""
