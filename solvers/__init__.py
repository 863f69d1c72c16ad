"""balanceroute.solvers."""
