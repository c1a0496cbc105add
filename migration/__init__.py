"""How state moves: assignments, plans and protocols."""
