"""Request handlers of the subresources other than imagepullprogress (which has its
own subpackage).

Handlers get their parts at construction and act on the request's one parsed
``RequestInfo``; they do no authorization (that is the authz layer's, from the
route table).
"""
