"""Through real Redis: the scripts, cluster, sentinel, TLS and ACL, processes sharing a rate."""
