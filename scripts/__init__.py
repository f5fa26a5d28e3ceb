"""gpu-pivot: the local side (config, routes, transport, rendering) and the agent package."""
