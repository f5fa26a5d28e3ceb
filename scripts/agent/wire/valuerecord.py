"""A read-only record whose fields are its class's annotations: the base of the results the
agent writes (records.Record) and the requests the local side sends (requests.Request).
Why one base: both must be frozen and equal by value, and both are built on the agent at
every start, where dataclasses cost ~15 ms an import."""


class ValueRecord:
    """Fields in annotation order; one without a class default is required, a list or dict
    default is copied. field_names may be narrowed by a subclass (requests skip ClassVars)."""

    def __init__(self, **values):
        for name in self.field_names():
            if name in values:
                value = values.pop(name)
            elif hasattr(type(self), name):
                value = getattr(type(self), name)
                value = type(value)(value) if isinstance(value, (list, dict)) else value
            else:
                raise TypeError("%s: %r is required" % (type(self).__name__, name))
            object.__setattr__(self, name, value)
        if values:
            raise TypeError("%s has no field %s" % (type(self).__name__, ", ".join(sorted(values))))

    @classmethod
    def field_names(cls):
        return list(cls.__annotations__)

    def __setattr__(self, name, value):
        raise AttributeError("%s is read-only" % type(self).__name__)

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % item for item in vars(self).items()))
