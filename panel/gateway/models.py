"""The gateway keeps no tables of its own: keys are `accounts.TeamKey`, usage records `usage.RequestLog`."""
