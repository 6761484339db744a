"""The consumer side of the queue: claim, complete, fail, poll, rescue, prune, cron."""
