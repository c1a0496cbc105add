"""The control plane's values, shared by the controllers (the top layer) and the
runtime that executes their decisions: reconfigurations as values with a reason
(``reconfiguration``: ``Scale``, ``Rebalance``, ``ChangeLogic``, ``Place``, ``NoChange``), the
read-only view of the job a controller decides on, and the records of what was decided.

May import: everything in the engine core and the task core, and ``migration``."""
