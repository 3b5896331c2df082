"""The code_interpreter sandbox: bubblewrap runs, their network and memory cgroup.

Neutral ground: the tool-runner deployment (``deployments.tool_runner``) runs it on CPU
worker nodes, and the gateway's unit tests run it in-process; neither imports the other.
"""
