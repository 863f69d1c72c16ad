"""balanceroute.serving."""
