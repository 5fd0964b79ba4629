"""Agents: the registry, the host-side tool loop, tools, trajectories and scripted policies."""
