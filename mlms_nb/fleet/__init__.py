"""The fleet of agents (issue 15): mlms agents are Dask distributed workers that advertise their stack (``mlms
agent``, :mod:`~mlms_nb.fleet.serve`); the registry lists them and picks the ones an evaluation's constraints allow
(:mod:`~mlms_nb.fleet.constraints`, :mod:`~mlms_nb.fleet.registry`); :mod:`~mlms_nb.fleet.run` runs evaluations
there through the ``dask`` launcher (:mod:`mlms_nb.launchers.dask_agent`). Dask itself is imported only when an
agent, a scheduler or a client is made. (Not ``mlms_nb/agents/``: the facade's ``mlms_nb.agents()`` has that name.)"""
