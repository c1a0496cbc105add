"""The control plane's values, shared by the controllers (the top layer) and the
runtime that executes their decisions: reconfigurations as values with a reason
(``reconfiguration``: ``Scale``, ``Rebalance``, ``ChangeLogic``, ``Place``, ``NoChange``), the
read-only view of the job a controller decides on, and the records of what was decided;
``steps``: deploy, recovery, change of logic and replica refresh as sans-IO step machines
in the rescale coordinator's command vocabulary (the runtime and the unit-test harness
execute them); ``job_state``: ``JobRecord``, the state of one job as one frozen value,
written by its JobMaster alone; ``durable``: a ``JobRecord`` as the durable job record
keeps it, and back; ``arbiter``: the sans-IO arbiter that decides from events what may run
together on a job (checkpoints, rescales, changes of logic, replica refreshes, the finish,
recovery).

May import: the engine core, ``engine.task`` and ``migration``."""
