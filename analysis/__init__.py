"""balanceroute.analysis."""
