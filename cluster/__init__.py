"""Past one GPU: one engine per GPU as Ray Serve replicas, sessions placed by the capacity each reports
(``cluster.app``)."""
