"""Who may do what: ACL users, the ACL LOG, and which arena partitions a user may map."""
