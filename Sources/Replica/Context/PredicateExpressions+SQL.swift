import Foundation

// The SQL translation of each Foundation `PredicateExpressions` node Replica understands (see PredicateTranslator.swift
// for the translator, operands and semantics). Each conformance translates its children through the translator.

extension PredicateExpressions.Variable: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { try t.lookup(key) }
}

extension PredicateExpressions.Value: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { .constant(value) }
}

extension PredicateExpressions.NilLiteral: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { .sql(.null) }
}

extension PredicateExpressions.KeyPath: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        try t.member(of: t.translate(root), keyPath: keyPath as AnyKeyPath)
    }
}

extension PredicateExpressions.Equal: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let l = try t.translate(lhs)
        let r = try t.translate(rhs)
        if case let .constant(a) = l, case let .constant(b) = r, let x = a as? LHS.Output, let y = b as? RHS.Output {
            return .constant(x == y)
        }
        return try t.equality(l, r, negated: false)
    }
}

extension PredicateExpressions.NotEqual: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let l = try t.translate(lhs)
        let r = try t.translate(rhs)
        if case let .constant(a) = l, case let .constant(b) = r, let x = a as? LHS.Output, let y = b as? RHS.Output {
            return .constant(x != y)
        }
        return try t.equality(l, r, negated: true)
    }
}

extension PredicateExpressions.Comparison: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let l = try t.translate(lhs)
        let r = try t.translate(rhs)
        if case .opaque = l { return .opaque }
        if case .opaque = r { return .opaque }
        if case let .constant(a) = l, case let .constant(b) = r, let x = a as? LHS.Output, let y = b as? RHS.Output {
            switch op {
            case .lessThan: return .constant(x < y)
            case .lessThanOrEqual: return .constant(x <= y)
            case .greaterThan: return .constant(x > y)
            case .greaterThanOrEqual: return .constant(x >= y)
            }
        }
        guard LHS.Output.self is any AttributeValue.Type else {
            throw PredicateTranslator.unsupportedComparison(LHS.Output.self)
        }
        let symbol: String
        switch op {
        case .lessThan: symbol = "<"
        case .lessThanOrEqual: symbol = "<="
        case .greaterThan: symbol = ">"
        case .greaterThanOrEqual: symbol = ">="
        }
        return .sql(try t.binary(l, symbol, r))
    }
}

extension PredicateTranslator {
    static func unsupportedComparison(_ type: Any.Type) -> Untranslatable {
        Untranslatable("ordering of \(shortName(of: type)) values")
    }
}

extension PredicateExpressions.Conjunction: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { try t.logical(lhs, rhs, and: true) }
}

extension PredicateExpressions.Disjunction: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { try t.logical(lhs, rhs, and: false) }
}

extension PredicateExpressions.Negation: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let inner = try t.translate(wrapped)
        if case .opaque = inner { return .opaque }
        if case let .constant(value) = inner, let flag = value as? Bool { return .constant(!flag) }
        let c = try t.condition(of: inner)
        return .sql(SQLExpr("(NOT \(c.text))", c.args, nullable: false, mayFail: c.mayFail))
    }
}

extension PredicateExpressions.Arithmetic: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let symbol: String
        switch op {
        case .add: symbol = "+"
        case .subtract: symbol = "-"
        case .multiply: symbol = "*"
        }
        guard LHS.Output.self == Int.self || LHS.Output.self == Double.self else {
            throw Untranslatable("arithmetic on \(PredicateTranslator.shortName(of: LHS.Output.self))")
        }
        let l = try t.translate(lhs)
        let r = try t.translate(rhs)
        if case .opaque = l { return .opaque }
        if case .opaque = r { return .opaque }
        return .sql(try t.binary(l, symbol, r))
    }
}

extension PredicateExpressions.UnaryMinus: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        guard Wrapped.Output.self == Int.self || Wrapped.Output.self == Double.self else {
            throw Untranslatable("negation of \(PredicateTranslator.shortName(of: Wrapped.Output.self))")
        }
        let inner = try t.translate(wrapped)
        if case .opaque = inner { return .opaque }
        let e = try t.scalar(inner)
        return .sql(SQLExpr("(- \(e.text))", e.args, nullable: e.nullable, mayFail: e.mayFail))
    }
}

/// Division translates only by a nonzero constant: SQL gives NULL where Swift traps or gives infinity.
private func division(_ t: PredicateTranslator, _ lhs: Any, _ rhs: Any, _ op: String, outputType: Any.Type) throws -> Operand {
    guard outputType == Int.self || outputType == Double.self else {
        throw Untranslatable("division of \(PredicateTranslator.shortName(of: outputType))")
    }
    let l = try t.translate(lhs)
    let r = try t.translate(rhs)
    if case .opaque = l { return .opaque }
    if case .opaque = r { return .opaque }
    guard case let .constant(divisor) = r else { throw Untranslatable("division by a value that may be zero") }
    if let int = divisor as? Int, int == 0 { throw Untranslatable("division by zero") }
    if let double = divisor as? Double, double == 0 || !double.isFinite { throw Untranslatable("division by zero") }
    return .sql(try t.binary(l, op, r))
}

extension PredicateExpressions.IntDivision: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { try division(t, lhs, rhs, "/", outputType: LHS.Output.self) }
}

extension PredicateExpressions.IntRemainder: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { try division(t, lhs, rhs, "%", outputType: LHS.Output.self) }
}

extension PredicateExpressions.FloatDivision: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand { try division(t, lhs, rhs, "/", outputType: LHS.Output.self) }
}

extension PredicateExpressions.Conditional: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let c = try t.translate(test)
        let a = try t.translate(trueBranch)
        let b = try t.translate(falseBranch)
        for operand in [c, a, b] { if case .opaque = operand { return .opaque } }
        if case let .constant(value) = c, let flag = value as? Bool { return flag ? a : b }
        let condition = try t.condition(of: c)
        let x = try t.scalar(a)
        let y = try t.scalar(b)
        return .sql(SQLExpr("(CASE WHEN \(condition.text) THEN \(x.text) ELSE \(y.text) END)", condition.args + x.args + y.args,
                            nullable: x.nullable || y.nullable, mayFail: condition.mayFail || x.mayFail || y.mayFail))
    }
}

extension PredicateExpressions.NilCoalesce: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let l = try t.translate(lhs)
        let r = try t.translate(rhs)
        if case .opaque = l { return .opaque }
        if case .opaque = r { return .opaque }
        if case let .constant(value) = l {
            if let optional = value as? any AnyOptional, let wrapped = optional.wrappedValue { return .constant(wrapped) }
            return r
        }
        let a = try t.scalar(l)
        let b = try t.scalar(r)
        return .sql(SQLExpr("COALESCE(\(a.text), \(b.text))", a.args + b.args, nullable: b.nullable, mayFail: a.mayFail || b.mayFail))
    }
}

/// Marks `Optional` metatypes. Internal.
protocol OptionalTypeMarker {}
extension Optional: OptionalTypeMarker {}

extension PredicateExpressions.OptionalFlatMap: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        // A flatMap whose result is itself optional (`T??`) has no SQL form: NULL cannot hold two levels of nil.
        if Result.self is any OptionalTypeMarker.Type { throw Untranslatable("a doubly optional value") }
        let source = try t.translate(wrapped)
        if case .opaque = source {
            _ = try? t.with(variable.key, bound: .opaque) { try t.translate(transform) }
            return .opaque
        }
        if case let .constant(value) = source {
            if let optional = value as? any AnyOptional, optional.isNil { return .sql(.null) }
        }
        let result = try t.with(variable.key, bound: source) { try t.translate(transform) }
        switch result {
        case .opaque, .record, .composite, .collection:
            // Reads through a NULL reference or composite are NULL by construction; to-many sets are not values.
            if case .collection = result { throw Untranslatable("a to-many relationship through an optional") }
            return result
        case .constant:
            if case .constant = source { return result }
        case let .sql(expression) where expression.propagatesNull:
            return result
        default:
            break
        }
        // Otherwise: nil when the source is nil, else the transform.
        let test = try t.scalar(source)
        let value = try t.scalar(result)
        return .sql(SQLExpr("(CASE WHEN \(test.text) IS NULL THEN NULL ELSE \(value.text) END)", test.args + value.args,
                            nullable: true, mayFail: test.mayFail || value.mayFail))
    }
}

extension PredicateExpressions.ForcedUnwrap: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let inner = try t.translate(self.inner)
        switch inner {
        case .opaque: return .opaque
        case let .constant(value):
            guard let optional = value as? any AnyOptional else { return inner }
            guard let wrapped = optional.wrappedValue else { throw Untranslatable("a force unwrap of a nil constant") }
            return .constant(wrapped)
        case let .record(record):
            let id = record.idExpr
            guard id.nullable else { return inner }
            let unwrapped = SQLExpr("replica_unwrap(\(id.text))", id.args, nullable: false, mayFail: true)
            return .record(RecordRef(entity: record.entity, access: .id(unwrapped), path: record.path))
        case let .composite(composite):
            guard composite.json.nullable else { return inner }
            let unwrapped = SQLExpr("replica_unwrap(\(composite.json.text))", composite.json.args, nullable: false, mayFail: true)
            return .composite(CompositeRef(json: unwrapped, path: composite.path, info: composite.info))
        default:
            let e = try t.scalar(inner)
            guard e.nullable else { return inner }
            return .sql(SQLExpr("replica_unwrap(\(e.text))", e.args, nullable: false, mayFail: true))
        }
    }
}

extension PredicateExpressions.SequenceContains: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        try t.membership(t.translate(sequence), t.translate(element))
    }
}

extension PredicateExpressions.SequenceContainsWhere: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let source = try t.translate(sequence)
        if case .opaque = source {
            _ = try? t.with(variable.key, bound: .opaque) { try t.translate(test) }
            return .opaque
        }
        guard case let .collection(collection) = source else { throw Untranslatable("contains(where:) over a computed sequence") }
        let element = Operand.record(RecordRef(entity: collection.element, access: .row(alias: collection.alias), path: collection.path))
        let inner = try t.with(variable.key, bound: element) { try t.translate(test) }
        if case .opaque = inner { return .opaque }
        let exists = collection.subquery(select: "1", extra: try t.condition(of: inner))
        return .sql(SQLExpr("EXISTS \(exists.text)", exists.args, nullable: false, mayFail: exists.mayFail))
    }
}

extension PredicateExpressions.SequenceAllSatisfy: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let source = try t.translate(sequence)
        if case .opaque = source {
            _ = try? t.with(variable.key, bound: .opaque) { try t.translate(test) }
            return .opaque
        }
        guard case let .collection(collection) = source else { throw Untranslatable("allSatisfy over a computed sequence") }
        let element = Operand.record(RecordRef(entity: collection.element, access: .row(alias: collection.alias), path: collection.path))
        let inner = try t.with(variable.key, bound: element) { try t.translate(test) }
        if case .opaque = inner { return .opaque }
        let c = try t.condition(of: inner)
        let counter = collection.subquery(select: "1", extra: SQLExpr("NOT \(c.text)", c.args, nullable: false, mayFail: c.mayFail))
        return .sql(SQLExpr("NOT EXISTS \(counter.text)", counter.args, nullable: false, mayFail: counter.mayFail))
    }
}

extension PredicateExpressions.Filter: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let source = try t.translate(sequence)
        if case .opaque = source {
            _ = try? t.with(variable.key, bound: .opaque) { try t.translate(filter) }
            return .opaque
        }
        guard case var .collection(collection) = source else { throw Untranslatable("filter over a computed sequence") }
        let element = Operand.record(RecordRef(entity: collection.element, access: .row(alias: collection.alias), path: collection.path))
        let inner = try t.with(variable.key, bound: element) { try t.translate(filter) }
        if case .opaque = inner { return .opaque }
        collection.conditions.append(try t.condition(of: inner))
        return .collection(collection)
    }
}

extension PredicateExpressions.CollectionContainsCollection: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        guard Base.Output.self == String.self, Other.Output.self == String.self else {
            throw Untranslatable("contains(_:) over \(PredicateTranslator.shortName(of: Base.Output.self))")
        }
        let b = try t.translate(base)
        let o = try t.translate(other)
        if case .opaque = b { return .opaque }
        if case .opaque = o { return .opaque }
        let haystack = try t.scalar(b)
        if case let .constant(value) = o, let needle = value as? String {
            // In a predicate, every string contains the empty string (the collection algorithm), as `instr` says.
            if needle.isEmpty { return .constant(true) }
            return .sql(SQLExpr("(instr(\(haystack.text), ?) > 0)", haystack.args + [.text(needle)],
                                nullable: haystack.nullable, mayFail: haystack.mayFail))
        }
        let needle = try t.scalar(o)
        return .sql(SQLExpr("(instr(\(haystack.text), \(needle.text)) > 0)", haystack.args + needle.args,
                            nullable: haystack.nullable || needle.nullable, mayFail: haystack.mayFail || needle.mayFail))
    }
}

extension PredicateExpressions.SequenceStartsWith: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        guard Base.Output.self == String.self, Prefix.Output.self == String.self else {
            throw Untranslatable("starts(with:) over \(PredicateTranslator.shortName(of: Base.Output.self))")
        }
        let b = try t.translate(base)
        let p = try t.translate(prefix)
        if case .opaque = b { return .opaque }
        if case .opaque = p { return .opaque }
        let text = try t.scalar(b)
        if case let .constant(value) = p, let prefix = value as? String {
            if prefix.isEmpty { return .constant(true) }
            return .sql(SQLExpr("(substr(\(text.text), 1, ?) = ?)", text.args + [.integer(Int64(prefix.unicodeScalars.count)), .text(prefix)],
                                nullable: text.nullable, mayFail: text.mayFail))
        }
        let start = try t.scalar(p)
        return .sql(SQLExpr("(substr(\(text.text), 1, length(\(start.text))) = \(start.text))", text.args + start.args + start.args,
                            nullable: text.nullable || start.nullable, mayFail: text.mayFail || start.mayFail))
    }
}

extension ReplicaPredicateExpressions.LocalizedStandardContains: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let b = try t.translate(root)
        let o = try t.translate(other)
        if case .opaque = b { return .opaque }
        if case .opaque = o { return .opaque }
        let haystack = try t.scalar(b)
        if case let .constant(value) = o, let needle = value as? any StringProtocol {
            let folded = ReplicaText.fold(String(needle))
            if folded.isEmpty { return .constant(false) }
            return .sql(SQLExpr("(instr(replica_fold(\(haystack.text)), ?) > 0)", haystack.args + [.text(folded)],
                                nullable: haystack.nullable, mayFail: haystack.mayFail))
        }
        let needle = try t.scalar(o)
        return .sql(SQLExpr("(length(replica_fold(\(needle.text))) > 0 AND instr(replica_fold(\(haystack.text)), replica_fold(\(needle.text))) > 0)",
                            needle.args + haystack.args + needle.args, nullable: haystack.nullable || needle.nullable,
                            mayFail: haystack.mayFail || needle.mayFail))
    }
}

extension PredicateExpressions.Range: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let l = try t.translate(lower)
        let u = try t.translate(upper)
        if case .opaque = l { return .opaque }
        if case .opaque = u { return .opaque }
        return .range(lower: try t.scalar(l), upper: try t.scalar(u), closed: false)
    }
}

extension PredicateExpressions.ClosedRange: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let l = try t.translate(lower)
        let u = try t.translate(upper)
        if case .opaque = l { return .opaque }
        if case .opaque = u { return .opaque }
        return .range(lower: try t.scalar(l), upper: try t.scalar(u), closed: true)
    }
}

extension PredicateExpressions.RangeExpressionContains: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        let r = try t.translate(range)
        let e = try t.translate(element)
        if case .opaque = r { return .opaque }
        if case .opaque = e { return .opaque }
        guard Element.Output.self is any AttributeValue.Type else { throw PredicateTranslator.unsupportedComparison(Element.Output.self) }
        let bounds: (lower: SQLExpr, upper: SQLExpr, closed: Bool)
        switch r {
        case let .range(lower, upper, closed): bounds = (lower, upper, closed)
        case let .constant(value):
            guard let constant = value as? any ConstantRange, let stored = constant.storedBounds else {
                throw Untranslatable("a range of values without a stored form")
            }
            bounds = (.parameter(stored.lower), .parameter(stored.upper), stored.closed)
        default:
            throw Untranslatable("a computed range")
        }
        let x = try t.scalar(e)
        let upperOp = bounds.closed ? "<=" : "<"
        return .sql(SQLExpr("(\(x.text) >= \(bounds.lower.text) AND \(x.text) \(upperOp) \(bounds.upper.text))",
                            x.args + bounds.lower.args + x.args + bounds.upper.args,
                            nullable: x.nullable || bounds.lower.nullable || bounds.upper.nullable,
                            mayFail: x.mayFail || bounds.lower.mayFail || bounds.upper.mayFail))
    }
}

/// Type checks and casts of a record: decided per entity (each member of a hierarchy is queried separately).
private func castTarget(_ t: PredicateTranslator, _ input: Any, desired: Any.Type) throws -> (RecordRef, matches: Bool)? {
    let operand = try t.translate(input)
    if case .opaque = operand { return nil }
    guard case let .record(record) = operand else {
        throw Untranslatable("a type check of a computed value")
    }
    guard desired is any PersistentModel.Type else {
        throw Untranslatable("a type check against \(PredicateTranslator.shortName(of: desired)), which is not a model type")
    }
    return (record, ObjectIdentifier(record.entity.modelType) == ObjectIdentifier(desired))
}

extension PredicateExpressions.TypeCheck: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        guard let (record, matches) = try castTarget(t, input, desired: Desired.self) else { return .opaque }
        if case let .id(id) = record.access, id.nullable, matches {
            return .sql(SQLExpr("(\(id.text) IS NOT NULL)", id.args, nullable: false, mayFail: id.mayFail))
        }
        return .constant(matches)
    }
}

extension PredicateExpressions.ConditionalCast: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        guard let (record, matches) = try castTarget(t, input, desired: Desired.self) else { return .opaque }
        // A known nil: an optional chain after it is nil too, without translating it.
        guard matches else { return .constant(Desired?.none as Any) }
        return .record(RecordRef(entity: record.entity, access: record.access, path: record.path))
    }
}

extension PredicateExpressions.ForceCast: SQLTranslatable {
    func translate(_ t: PredicateTranslator) throws -> Operand {
        guard let (record, matches) = try castTarget(t, input, desired: Desired.self) else { return .opaque }
        guard matches else { throw Untranslatable("a force cast that fails for some records") }
        return .record(RecordRef(entity: record.entity, access: record.access, path: record.path))
    }
}

// MARK: - Top-level conjuncts

/// Splits a top-level conjunction into its parts. Internal.
protocol ConjunctionSplitting {
    var conjuncts: [Any] { get }
}

extension PredicateExpressions.Conjunction: ConjunctionSplitting {
    var conjuncts: [Any] {
        func parts(_ expression: Any) -> [Any] {
            (expression as? any ConjunctionSplitting)?.conjuncts ?? [expression]
        }
        return parts(lhs) + parts(rhs)
    }
}
