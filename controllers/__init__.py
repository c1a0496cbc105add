"""Policies that decide reconfigurations (DS2 autoscaler, balancer, ...)."""
