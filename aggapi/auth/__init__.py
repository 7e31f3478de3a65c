"""Who may call whom. Users: delegated authentication and authorization through
kube-apiserver (TokenReview, SubjectAccessReview, cached). The apiserver to its agents:
signed capability tokens and their published keys. The agents: serving identities
attested by Kubernetes. Shared by the apiserver and the agent."""
