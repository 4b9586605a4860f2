// Model declarations that fail early: an entity description that disagrees with its Swift type is found when the
// container opens (`ReplicaError.invalidModelDeclaration`, naming the member and the property), never at a read.
import Foundation
import Testing
@testable import Replica

// MARK: - One model per kind of mismatch

/// `notes` is a stored (decoded) property that the entity does not describe.
private struct UndescribedProperty: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var notes: String = ""
    static let entity = ModelEntity<UndescribedProperty>([.attribute("title", \.title, default: "")])
}

/// The attribute is named `content`, the property `body`.
private struct RenamedAttribute: PersistentModel, Codable {
    var id = UUID.unassigned
    var body: String = ""
    static let entity = ModelEntity<RenamedAttribute>([.attribute("content", \.body, default: "")])
}

/// The same, written through `encode(to:)`.
private struct RenamedCodableAttribute: CodablePersistentModel {
    var id = UUID.unassigned
    var body: String = ""
    static let entity = ModelEntity<RenamedCodableAttribute>([.attribute("content", \.body, default: "")])
}

/// `count` is stored as text, but the attribute of that name is bound to an integer view of it.
private struct RetypedAttribute: PersistentModel, Codable {
    var id = UUID.unassigned
    var count: String = ""
    var countValue: Int {
        get { Int(count) ?? 0 }
        set { count = String(newValue) }
    }
    static let entity = ModelEntity<RetypedAttribute>([.attribute("count", \.countValue, default: 0)])
}

/// `rating` is an `Int`, but the attribute is bound to a `Double` view with a default of 2.5, which no `Int` reads.
private struct FractionalDefault: PersistentModel, Codable {
    var id = UUID.unassigned
    var rating: Int = 0
    var ratingValue: Double {
        get { Double(rating) }
        set { rating = Int(newValue) }
    }
    static let entity = ModelEntity<FractionalDefault>([.attribute("rating", \.ratingValue, default: 2.5)])
}

private struct Owner: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<Owner>([.attribute("name", \.name, default: "")])
}

/// `owner` is a reference, but it is declared as an attribute (through a UUID view of it).
private struct ReferenceAsAttribute: PersistentModel, Codable {
    var id = UUID.unassigned
    var owner: Reference<Owner>?
    var ownerID: UUID? {
        get { owner?.id }
        set { owner = newValue.map { Reference($0) } }
    }
    static let entity = ModelEntity<ReferenceAsAttribute>([.attribute("owner", \.ownerID)])
}

/// `ownerID` is a plain UUID, but it is declared as a to-one relationship (through a reference view of it).
private struct AttributeAsReference: PersistentModel, Codable {
    var id = UUID.unassigned
    var ownerID: UUID?
    var owner: Reference<Owner>? {
        get { ownerID.map { Reference($0) } }
        set { ownerID = newValue?.id }
    }
    static let entity = ModelEntity<AttributeAsReference>([.toOne("ownerID", \.owner)])
}

/// `note` is a required `String`, but the attribute is bound to an optional view of it (an empty note is stored as
/// NULL, which the property cannot read).
private struct OptionalOnRequired: PersistentModel, Codable {
    var id = UUID.unassigned
    var note: String = ""
    var maybeNote: String? {
        get { note.isEmpty ? nil : note }
        set { note = newValue ?? "" }
    }
    static let entity = ModelEntity<OptionalOnRequired>([.attribute("note", \.maybeNote)])
}

/// Two attributes bound to each other's property: every save swaps the values.
private struct SwappedKeyPaths: PersistentModel, Codable {
    var id = UUID.unassigned
    var title: String = ""
    var subtitle: String = ""
    static let entity = ModelEntity<SwappedKeyPaths>([
        .attribute("title", \.subtitle, default: ""),
        .attribute("subtitle", \.title, default: ""),
    ])
}

/// A hand-written `init(row:)` that reads a field the entity does not have.
private struct MisreadRow: PersistentModel {
    var id = UUID.unassigned
    var title: String = ""
    static let entity = ModelEntity<MisreadRow>([.attribute("title", \.title, default: "")])
    init() {}
    init(row: ModelRow) throws {
        id = row.id
        title = try row.decode(String.self, named: "heading")
    }
}

/// The mismatches a container of `models` reports when it opens (empty when it opens).
private func mismatches(_ models: any PersistentModel.Type...) -> [ModelDeclarationMismatch] {
    do {
        _ = try ModelContainer(for: Schema(models), configurations: [ModelConfiguration("declarations", isStoredInMemoryOnly: true)],
                               environment: .seeded(seed: 1, directory: temporaryTestDirectory()))
        return []
    } catch let ReplicaError.invalidModelDeclaration(found) {
        return found
    } catch {
        Issue.record("unexpected error \(error)")
        return []
    }
}

@Suite("Model declarations checked when the container opens")
struct ModelDeclarationCheckTests {
    @Test("a stored property with no attribute of its name is reported")
    func propertyWithoutAttribute() {
        let found = mismatches(UndescribedProperty.self)
        #expect(found == [.propertyWithoutMember(entity: "UndescribedProperty", property: "notes", type: "String")])
        #expect(found.first?.description.contains("UndescribedProperty.notes") == true)
    }

    @Test("an attribute whose name is no coding key is reported with the property its key path names")
    func attributeWithoutCodingKey() {
        let found = mismatches(RenamedAttribute.self)
        #expect(found.contains(.memberWithoutProperty(entity: "RenamedAttribute", member: "content", keyPath: "\\RenamedAttribute.body")))
        #expect(found.contains(.propertyWithoutMember(entity: "RenamedAttribute", property: "body", type: "String")))
        let codable = mismatches(RenamedCodableAttribute.self)
        #expect(codable.contains(.memberWithoutProperty(entity: "RenamedCodableAttribute", member: "content",
                                                        keyPath: "\\RenamedCodableAttribute.body")))
        // The message says how to map a property of another name.
        let message = ModelDeclarationMismatch.memberWithoutProperty(entity: "RenamedCodableAttribute", member: "content",
                                                                     keyPath: "\\RenamedCodableAttribute.body").description
        #expect(message.contains("map it in CodingKeys (case <property> = \"content\")"))
    }

    @Test("an attribute of another type than its property is reported with both types")
    func attributeOfAnotherType() {
        let found = mismatches(RetypedAttribute.self)
        #expect(found.count == 1)
        guard case let .typeMismatch(entity, attribute, attributeType, _, property, propertyType)? = found.first else {
            Issue.record("expected a type mismatch, found \(found)")
            return
        }
        #expect([entity, attribute, attributeType, property, propertyType] == ["RetypedAttribute", "count", "Int", "count", "String"])
    }

    @Test("a default that the property's type cannot read is reported")
    func defaultOfWrongType() {
        let found = mismatches(FractionalDefault.self)
        #expect(found.contains(.defaultOfWrongType(entity: "FractionalDefault", attribute: "rating", storedForm: "REAL",
                                                   propertyType: "Int")))
    }

    @Test("a relationship declared as an attribute is reported")
    func relationshipAsAttribute() {
        let found = mismatches(ReferenceAsAttribute.self, Owner.self)
        #expect(found == [.relationshipDeclaredAsAttribute(entity: "ReferenceAsAttribute", attribute: "owner", property: "owner",
                                                           propertyType: "Reference<Owner>?")])
    }

    @Test("an attribute declared as a relationship is reported")
    func attributeAsRelationship() {
        let found = mismatches(AttributeAsReference.self, Owner.self)
        #expect(found == [.attributeDeclaredAsRelationship(entity: "AttributeAsReference", relationship: "ownerID",
                                                           destination: "Owner", property: "ownerID", propertyType: "UUID?")])
    }

    @Test("an optional attribute on a non-optional property is reported")
    func optionalOnRequired() {
        let found = mismatches(OptionalOnRequired.self)
        #expect(found.count == 1)
        guard case let .optionalMemberOnRequiredProperty(entity, member, _, property, propertyType)? = found.first else {
            Issue.record("expected an optional member on a required property, found \(found)")
            return
        }
        #expect([entity, member, property, propertyType] == ["OptionalOnRequired", "note", "note", "String"])
    }

    @Test("attributes bound to each other's property are reported")
    func swappedKeyPaths() {
        let found = mismatches(SwappedKeyPaths.self)
        #expect(found == [
            .fieldDoesNotRoundTrip(entity: "SwappedKeyPaths", field: "title", keyPath: "\\SwappedKeyPaths.subtitle"),
            .fieldDoesNotRoundTrip(entity: "SwappedKeyPaths", field: "subtitle", keyPath: "\\SwappedKeyPaths.title"),
        ])
    }

    @Test("a hand-written init(row:) that reads a field the entity lacks is reported")
    func misreadRow() {
        let found = mismatches(MisreadRow.self)
        #expect(found.count == 1)
        guard case let .unreadableRecord(entity, reason)? = found.first else {
            Issue.record("expected an unreadable record, found \(found)")
            return
        }
        #expect(entity == "MisreadRow")
        #expect(reason.contains("heading"))
    }

    @Test("every model the tests declare at file scope passes the check")
    func everyTestModelPasses() {
        let models: [any PersistentModel.Type] = [
            PinV1.self, PinV2.self, CycleNode.self, Keepsake.self, LocalDraft.self, AdvMeasure.self, AdvPlace.self,
            SyncTag.self, UItem.self, UTrip.self, RFolder.self, RNote.self, RPage.self, RShelf.self, PlainDiary.self,
            LiveNote.self, OList.self, OTag.self, OTask.self, RecycleConcurrent.self, RecycleHeld.self,
            RecycleKinds.self, RecycleKindsExtra.self, RecycleLive.self, RecycleOverlay.self,
            RecycleSchemaChange.self, RecycleStop.self, RecycleSynced.self, RecycleTrip.self, MoodNoteV1.self,
            MoodNoteV2.self, MoodNoteV3.self, CopyNote.self, Account.self, Album.self, Book.self, Document.self,
            Everything.self, EverythingFast.self, Folder.self, Item.self, Membership.self, Note.self, Page.self,
            Person.self, Photo.self, Player.self, Shelf.self, Team.self, Trip.self, User.self, QFolder.self,
            QItem.self, QLodging.self, QNote.self, QPerson.self, QPlaylist.self, QSong.self, QTag.self, QTrip.self,
            Diary.self, DiaryV2.self, Passport.self, Tag.self, DAddress.self, DPerson.self, SyncNote.self,
            SyncNoteV2.self, NItem.self, NTrip.self, SItem.self, SStep.self, STrip.self, CodableChild.self,
            CodableOwner.self, EverythingCodable.self, PartialEncoder.self, CodeV1.self, CodeV2.self, Ledger.self,
            SyncMembership.self, Ticket.self,
        ]
        for model in models {
            #expect(model.declarationMismatches == [], "\(model)")
        }
    }
}
