"""Jobs that run: the bus, the node agent and its runtimes, the lifecycle the reconciler reads
back, the controller loop and the bootstrap that starts an agent on a cloud instance.

The plan decides where replicas go; apply publishes that to the bus (assignments/); one agent
per instance starts and stops what is assigned to it and reports back (runs/, agents/);
observe reads the reports, so a finished job frees its capacity and a lost or interrupted
instance's work is placed again."""
