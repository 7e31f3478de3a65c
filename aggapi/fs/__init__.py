"""Writing into local directory trees, shared by the agent's copy engine and the ncp
client's downloads: walking by file descriptor, syncfs(2) durability, and handing
received bytes to a blocking file writer in batches, off the event loop."""
