"""The moving parts of a node (River's split): the queue API, and the pool that runs attempts."""
